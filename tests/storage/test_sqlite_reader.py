"""The batched SQLite reader (``storage.sqlite.reader.GroupReader``): reads are answered in
batches, a read after close is refused, and a close racing reads leaves none unanswered."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import pytest

from storage.sqlite.reader import GroupReader


class Unavailable(Exception):
    pass


def _reader(path: Path) -> GroupReader:
    def open_() -> sqlite3.Connection:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        conn.execute("CREATE TABLE IF NOT EXISTS t (n INTEGER)")
        return conn

    return GroupReader(open_, classify=lambda e: Unavailable(str(e)), unavailable=Unavailable)


async def test_concurrent_reads_are_answered_each_with_its_own_result(tmp_path) -> None:
    reader = _reader(tmp_path / "r.db")
    try:
        results = await asyncio.gather(
            *(reader.submit_async(lambda c, i=i: c.execute("SELECT ?", (i,)).fetchone()[0])
              for i in range(200))
        )  # fmt: skip
        assert results == list(range(200))
        assert reader.reads == 200 and reader.batches <= 200
        # A read that fails fails alone.
        bad = reader.submit_async(lambda c: c.execute("SELECT * FROM missing").fetchall())
        good = reader.submit_async(lambda c: 7)
        with pytest.raises(Unavailable):
            await bad
        assert await good == 7
    finally:
        reader.close()


async def test_a_read_after_close_is_refused(tmp_path) -> None:
    reader = _reader(tmp_path / "r.db")
    reader.close()
    with pytest.raises(Unavailable):
        reader.submit_async(lambda c: 1)


async def test_a_close_racing_reads_leaves_none_unanswered(tmp_path) -> None:
    # Each read submitted while another thread closes the reader is either answered or
    # refused at once: none waits for ever.
    for _ in range(20):
        reader = _reader(tmp_path / "r.db")
        closer = threading.Thread(target=reader.close)
        futures: list[asyncio.Future[int]] = []
        closer.start()
        for _ in range(300):
            try:
                futures.append(reader.submit_async(lambda c: 1))
            except Unavailable:
                break
            await asyncio.sleep(0)
        closer.join()
        done = await asyncio.wait_for(asyncio.gather(*futures), timeout=10)
        assert done == [1] * len(futures)
