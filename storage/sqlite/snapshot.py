"""One consistent copy of every SQLite file of a state directory: each file as it was at the
same point of the ledger's history (`reveille backup`, `reveille restore`).

Each store is its own file, written by its own transactions, so a copy of each taken one
after the other (the ledger, then the sessions) is a snapshot of a different moment: a
transcript could promise "Handle: deleg_…" for a unit whose ledger row was written after the
ledger's copy was taken, and the restored conversation would wait for it forever.

``copy_consistent(files, fence, target)`` fixes every file's snapshot while the ledger
(``fence``) takes no write:

1. ``BEGIN IMMEDIATE`` on the ledger, its ``WriteLock`` taken first as every writer of the
   file does: once it returns, no ledger write commits until it ends.
2. A read transaction on every file (the ledger too, on its own connection) is started and
   its snapshot fixed (WAL: a reader sees what was committed when it first read).
3. The ledger's write lock is let go (ledger writers waited only for steps 2-3, a few
   milliseconds); each file is then copied with SQLite's backup API through the reader that
   holds its fixed snapshot, however long that takes, while servers go on writing.

Why that is one point of the ledger's history, for the two orders Reveille writes in:

- A unit is started by writing its ledger row (committed) before the turn that names its
  handle is stored. A transcript row in the copy was committed before its snapshot was
  fixed, inside the fence; its ledger row was committed earlier still, and no ledger commit
  happens inside the fence, so it was committed before the fence began and the ledger's
  snapshot (fixed inside the fence) holds it.
- A result is delivered by writing the transcript row, then marking the ledger row
  delivered. A row the ledger's copy calls delivered was marked before the fence; its
  transcript row was written before that, so the transcript's copy holds it. A delivery
  that had not reached the ledger is pending in the copy and is offered again after a
  restore (the transcript's rows are keyed by delivery id: never written twice).

So "transcripts first, ledger last" holds even with no order between the copies, and the
ledger is blocked for the time it takes to open a read transaction per file, not for the
time of the copy. Files that are not in WAL mode (made by hand) are copied the same way;
their readers hold a shared lock, so their writers wait for the copy.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path

from storage.sqlite.write_lock import WriteLock

__all__ = ["FENCE_TIMEOUT_SECONDS", "copy_consistent"]

# How long the fence waits for a ledger writer to commit (a server's batch, a prune).
FENCE_TIMEOUT_SECONDS = 30.0


def _reader(path: Path) -> sqlite3.Connection:
    # Read-only: the copy never writes to a live store (not even a journal-mode switch).
    conn = sqlite3.connect(
        f"file:{path}?mode=ro", uri=True, isolation_level=None, timeout=FENCE_TIMEOUT_SECONDS
    )
    conn.execute(f"PRAGMA busy_timeout = {int(FENCE_TIMEOUT_SECONDS * 1000)}")
    return conn


def _fix_snapshot(conn: sqlite3.Connection) -> None:
    """Start a read transaction and read, so its snapshot is fixed from now on."""
    conn.execute("BEGIN")
    conn.execute("SELECT count(*) FROM sqlite_master").fetchone()


def _new_private(target: Path) -> sqlite3.Connection:
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)
    return sqlite3.connect(target)


def _write_copy(reader: sqlite3.Connection, target: Path) -> None:
    """The reader's snapshot into the new file ``target`` (0600, one self-contained file)."""
    dst = _new_private(target)
    try:
        # One step (pages=-1): the whole file through the reader's open read transaction.
        reader.backup(dst, pages=-1)
        dst.execute("PRAGMA journal_mode = DELETE")
    finally:
        dst.close()


@contextlib.contextmanager
def _fenced(fence: Path | None) -> Iterator[None]:
    """No ledger write commits inside this block."""
    if fence is None:
        yield
        return
    conn = sqlite3.connect(fence, isolation_level=None, timeout=FENCE_TIMEOUT_SECONDS)
    lock = WriteLock(str(fence))
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(FENCE_TIMEOUT_SECONDS * 1000)}")
        with lock:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield
            finally:
                conn.execute("ROLLBACK")  # nothing was written: the lock only
    finally:
        lock.close()
        conn.close()


def copy_consistent(files: Sequence[Path], fence: Path | None, target: Path) -> list[str]:
    """Copy ``files`` (existing SQLite files) into the directory ``target`` under their own
    names, every one as of one moment in which the ledger ``fence`` (one of ``files``, or
    None when there is no ledger) committed nothing. Returns the names copied."""
    readers: list[tuple[Path, sqlite3.Connection]] = []
    try:
        for path in files:
            readers.append((path, _reader(path)))
        with _fenced(fence if fence in files else None):
            for _, reader in readers:
                _fix_snapshot(reader)
        for path, reader in readers:
            _write_copy(reader, target / path.name)
            reader.execute("COMMIT")
    finally:
        for _, reader in readers:
            reader.close()
    return [path.name for path, _ in readers]
