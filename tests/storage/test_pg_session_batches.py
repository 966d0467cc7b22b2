"""Group commit of the PostgreSQL session store (``storage.postgres.session_batches``).

Coroutines' writes that wait together commit as one transaction, each seeing what the ones
queued before it wrote; one that fails gets exactly the failure it gets alone, and the
others of its batch still commit, once. A batch is made deterministic here by holding the
advisory lock of the first write's session from another connection: the only writer waits
on it while the rest queue behind, then takes them all at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

import storage
from delivery.session_backend import NewMessage, NewSession, SessionGone
from storage.postgres import sql as q
from storage.postgres import trips
from storage.postgres.sessions import PostgresSessions
from tests.pg_support import fresh_url


@pytest.fixture
def url() -> str:
    return fresh_url()


@contextlib.contextmanager
def _opened(url: str, **threads: int) -> Iterator[PostgresSessions]:
    """The PostgreSQL session store at ``url`` (``writers=``, ``readers=``), closed after."""
    store = storage.open_storage(url).open_sessions(**threads)
    assert isinstance(store, PostgresSessions)
    try:
        yield store
    finally:
        store.close()


@pytest.fixture
def backend(url: str) -> Iterator[PostgresSessions]:
    with _opened(url, writers=1) as store:
        yield store


def _says(text: str) -> list[NewMessage]:
    return [NewMessage("user", text)]


async def _until(done: Callable[[], bool]) -> None:
    while not done():
        await asyncio.sleep(0.01)


async def _queued_behind_a_lock(
    url: str, backend: PostgresSessions, writes: list[tuple[str, str, bool]]
) -> list[object]:
    """Run ``writes`` (session, text, create) as coroutines, all but the first queued while
    the single writer waits on the first one's session lock; their results (or exceptions)."""

    def write(sid: str, text: str, create: bool) -> asyncio.Future[None]:
        new = NewSession() if create else None
        return asyncio.ensure_future(backend.aappend_turn(sid, _says(text), create=new))

    queue = backend.tx._batches._queue  # type: ignore[attr-defined]
    with psycopg.connect(url, autocommit=True) as holder:
        holder.execute("BEGIN")
        holder.execute(q.SQL_LOCK_KEY, (writes[0][0],))
        tasks = [write(*writes[0])]

        def writer_waits() -> bool:
            waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            row = holder.execute(waiting).fetchone()
            return row is not None and row[0] > 0

        await _until(writer_waits)
        tasks += [write(*w) for w in writes[1:]]
        await _until(lambda: len(queue.pending) == len(writes) - 1)
        holder.execute("COMMIT")
    return list(await asyncio.gather(*tasks, return_exceptions=True))


def _texts(backend: PostgresSessions, sid: str) -> list[str]:
    return [m.content for m in backend.messages(sid, 0, None)]


async def test_writes_waiting_together_commit_as_one_transaction(
    url: str, backend: PostgresSessions
) -> None:
    before = backend.stats()
    writes = [("a", "one", True), ("b", "two", True), ("b", "three", False), ("c", "four", True)]
    results = await _queued_behind_a_lock(url, backend, writes)
    assert results == [None, None, None, None]
    after = backend.stats()
    assert after["writes"] - before["writes"] == 4
    # The first write alone (the writer took it before the rest were queued), then the
    # three behind it in one transaction.
    assert after["commits"] - before["commits"] == 2
    assert _texts(backend, "a") == ["one"]
    assert _texts(backend, "b") == ["two", "three"]  # the second saw the first's session
    assert _texts(backend, "c") == ["four"]


async def test_a_write_that_fails_in_a_batch_fails_alone_and_the_rest_commit_once(
    url: str, backend: PostgresSessions
) -> None:
    # "nobody" was never created: that append is refused (SessionGone), as it is alone.
    writes = [("a", "one", True), ("b", "two", True), ("nobody", "x", False), ("c", "four", True)]
    results = await _queued_behind_a_lock(url, backend, writes)
    assert results[0] is None and results[1] is None and results[3] is None
    assert isinstance(results[2], SessionGone)
    assert _texts(backend, "b") == ["two"]  # run again alone after the rollback: once
    assert _texts(backend, "c") == ["four"]
    assert backend.get_session("nobody") is None


async def test_a_write_queued_after_close_is_refused(url: str) -> None:
    store = storage.open_storage(url).open_sessions()
    store.close()
    with pytest.raises(Exception, match="closed"):
        await store.aappend_turn("a", _says("late"), create=NewSession())


async def test_a_turns_messages_go_in_one_insert_in_their_order_and_touch_the_session(
    backend: PostgresSessions,
) -> None:
    many = [NewMessage("user", f"m{n}", dedupe_key=f"k{n % 70}") for n in range(75)]
    await backend.aappend_turn("s", many, create=NewSession())
    stored = backend.messages("s", 0, None)
    # 70 distinct keys: the 5 repeated ones (in the second chunk) are no error, and skipped.
    assert [m.content for m in stored] == [f"m{n}" for n in range(70)]
    assert [m.id for m in stored] == sorted(m.id for m in stored)
    created = backend.get_session("s")
    assert created is not None and created.updated_at == created.created_at
    await backend.aappend_turn("s", _says("later"))
    touched = backend.get_session("s")
    assert touched is not None and touched.updated_at > created.updated_at


async def test_reads_waiting_together_send_their_first_statements_in_one_trip(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, url: str
) -> None:
    monkeypatch.setenv(trips.ENV, str(tmp_path))  # the store opens counting connections
    with _opened(url, readers=1) as store:
        await store.aappend_turn("a", _says("hello"), create=NewSession())
        alone = [await store.asessions_by_prefix(p, 10) for p in ("a", "zz", "b")]
        # The only reader is held by a read of our own while the rest queue behind it.
        held, release = threading.Event(), threading.Event()

        def hold(_rows: object) -> None:
            held.set()
            release.wait()

        reads = store.tx._reads  # type: ignore[attr-defined]
        holding = reads.submit(hold)
        await asyncio.to_thread(held.wait)
        queued = [asyncio.ensure_future(store.asessions_by_prefix(p, 10)) for p in ("a", "zz", "b")]
        while len(reads._queue.pending) < len(queued):
            await asyncio.sleep(0.01)
        before = trips.total()
        release.set()
        await holding
        together = await asyncio.gather(*queued)
        assert together == alone
        # One trip for the three lookups, one for the transcript of the session found.
        assert trips.total() - before == 2


async def test_writes_of_distinct_sessions_in_a_batch_cost_two_trips(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, url: str
) -> None:
    monkeypatch.setenv(trips.ENV, str(tmp_path))  # the store opens counting connections
    with _opened(url, writers=1) as store:
        await store.aappend_turn("c", _says("earlier"), create=NewSession())
        before = trips.total()
        writes = [("a", "one", True), ("b", "two", True), ("c", "three", False), ("d", "x", True)]
        results = await _queued_behind_a_lock(url, store, writes)
        assert results == [None, None, None, None]
        # The first write alone (its lock's answer, then COMMIT), then the batch of three:
        # BEGIN, the locks and every first read in one trip, their writes and COMMIT in one.
        assert trips.total() - before == 4
        assert _texts(store, "c") == ["earlier", "three"]  # its first read found it live
        assert [_texts(store, s) for s in "abd"] == [["one"], ["two"], ["x"]]


async def test_a_batchs_new_sessions_and_messages_land_in_the_order_they_were_queued(
    url: str, backend: PostgresSessions
) -> None:
    # The batch's inserts are held and sent together (``held_inserts``): every session is
    # there, each message under its own, with ids drawn in the order the writes were queued.
    writes = [("first", "0", True)] + [(f"s{n}", f"t{n}", True) for n in range(6)]
    writes.insert(3, ("s0", "again", False))  # an append to a session the batch created
    results = await _queued_behind_a_lock(url, backend, writes)
    assert results == [None] * len(writes)
    stored = [
        m for sid in ["first"] + [f"s{n}" for n in range(6)] for m in backend.messages(sid, 0, None)
    ]
    assert sorted(m.content for m in stored) == sorted(text for _, text, _ in writes)
    by_id = [m.content for m in sorted(stored, key=lambda m: m.id)]
    assert by_id == [text for _, text, _ in writes]
    assert all(backend.get_session(sid) is not None for sid, _, _ in writes)
