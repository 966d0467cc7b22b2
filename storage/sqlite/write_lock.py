"""A blocking OS lock that queues the writers of one SQLite file, across processes.

SQLite's own write lock does not queue: a writer that finds it taken sleeps and polls (the
busy handler's 1, 2, 5, 10 ms... steps), so with several processes writing one file
(``reveille serve --workers N``) each commit also waits out the rest of a sleep after the
lock came free: throughput falls and p99 grows with the number of processes. So every
writer of a file first takes ``flock`` on the sidecar file ``<db>-writelock`` and holds it
from before ``BEGIN IMMEDIATE`` until after ``COMMIT``/``ROLLBACK``; the kernel hands the
lock to a waiter the moment it is let go. The waiting thread is a writer thread or a
caller's worker thread, never an event loop.

SQLite's lock and busy timeout stay as they were: the flock only orders the writers that take
it. A writer that does not (an older Reveille, the ``sqlite3`` shell) still takes SQLite's
lock, and whoever holds the flock then waits for it through the busy handler, as before.
Waiting for the flock has no timeout of its own: it lasts as long as the holder's
transaction, whose own wait for SQLite's lock the busy timeout bounds; a holder that dies
lets go at once (the kernel closes its file), one that is stopped holds the others up.

``WriteLock(db_path)``: one open file of its own (two connections of one process exclude
each other too: ``flock`` belongs to the open file, not the process); ``with lock:`` holds it.
A thread that already holds a file's flock (a write to a file nested in another write to
it) does not wait for itself: it goes on to SQLite's busy timeout as it did before. A lock
file that cannot be opened (a read-only directory) means SQLite's lock alone; so does one
deleted while servers run (each then locks a file of its own): slower, never unsafe.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from types import TracebackType

__all__ = ["SUFFIX", "WriteLock"]

SUFFIX = "-writelock"

log = logging.getLogger(__name__)

# The lock files each thread holds now (a thread's nested write must not wait for itself).
_held = threading.local()


def _held_by_this_thread() -> set[str]:
    held: set[str] | None = getattr(_held, "paths", None)
    if held is None:
        held = _held.paths = set()
    return held


class WriteLock:
    """The cross-process write lock of the SQLite file ``db_path`` (see the module
    docstring). Not reentrant across ``with`` blocks of one object; one holder at a time."""

    def __init__(self, db_path: str) -> None:
        self.path = db_path + SUFFIX
        self._taken = False  # whether this object's ``with`` block holds the flock now
        try:
            # 0600 like the database; O_CLOEXEC: a child process never inherits the lock.
            self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            log.debug("no write lock file %s (%s); SQLite's lock alone", self.path, exc)
            self._fd = None

    def __enter__(self) -> WriteLock:
        fd = self._fd
        if fd is None:
            return self
        held = _held_by_this_thread()
        if self.path in held:
            return self  # nested: SQLite's busy timeout decides, as without the flock
        fcntl.flock(fd, fcntl.LOCK_EX)  # blocks this thread only; the GIL is let go
        held.add(self.path)
        self._taken = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self._taken:
            return
        self._taken = False
        _held_by_this_thread().discard(self.path)
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """Let the file go (a held flock goes with it)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
