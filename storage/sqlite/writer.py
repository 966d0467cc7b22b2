"""Group commit for SQLite: one writer thread commits all waiting operations together.

Used by the ledger and by the session store. Callers hand in an operation (a function of
the writer's context, usually its connection); the writer takes every operation that is
waiting, runs them in one ``BEGIN IMMEDIATE`` transaction and commits once, so concurrent
operations share one fsync of the log instead of paying one each. An operation that raises
fails alone: if it had already changed rows, the batch is rolled back and run again with a
savepoint around each operation. Waiters are threads (``submit``/``write``) or coroutines
(``submit_async``); each event loop is woken once per commit, not once per operation.

Durability per operation: ``durable=False`` marks a write whose loss in a power cut can only
cause a redelivery that the sinks absorb. A batch of only such writes commits under
``PRAGMA synchronous = NORMAL`` (in WAL mode: committed to the log without waiting for the
disk; a process crash loses nothing, a power cut may lose the last such commits); a batch
with any durable write commits under ``FULL``, and that fsync of the log also makes every
earlier NORMAL commit durable.

Several processes writing one file (``reveille serve --workers N``): each commit holds the
file's ``WriteLock`` (``storage.sqlite.write_lock``, a kernel queue instead of SQLite's
sleep-and-poll) from before ``BEGIN IMMEDIATE`` until after ``COMMIT``, and takes into its
transaction what was queued while it waited for it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Generic, TypeVar

from delivery.write_future import WriteFuture
from storage.group_commit import Batch, BatchQueue, CommitCounts, Item, Live, wanted
from storage.sqlite.write_lock import WriteLock
from storage.waiters import LoopWaiter, Outcome

T = TypeVar("T")
C = TypeVar("C")
log = logging.getLogger(__name__)


class GroupCommitWriter(CommitCounts, Generic[C]):
    """The one writer of a SQLite file in this process.

    ``open`` runs on the writer thread and returns its connection (errors reach the
    constructor's caller); ``context`` turns it into what operations receive; ``unavailable``
    builds the exception callers get when nothing could be written.
    """

    def __init__(
        self,
        path: str,
        open: Callable[[], sqlite3.Connection],
        *,
        context: Callable[[sqlite3.Connection], C],
        unavailable: Callable[[str], Exception],
        name: str = "sqlite-writer",
        max_batch: int = 1024,
    ) -> None:
        super().__init__()  # durable_commits: each one fsync of the log (WAL, synchronous=FULL)
        self.path = path
        self._context = context
        self._unavailable = unavailable
        # Operations waiting, and whether a batch is being committed (by the writer thread or
        # inline by a caller); both under the queue's ``cv``, which wakes the writer thread.
        self._queue = BatchQueue(max_batch)
        self._mu = self._queue.cv
        self._busy = False
        self._closed = False
        self._synchronous: str | None = None  # the writer connection's current level
        self._conn: sqlite3.Connection | None = None
        self._ctx: Any = None
        ready: Future[None] = Future()
        self._thread = threading.Thread(
            target=self._main, args=(open, ready), name=name, daemon=True
        )
        self._thread.start()
        ready.result()
        self._inode = os.stat(path).st_ino
        self._write_lock = WriteLock(path)

    # -- callers --------------------------------------------------------------------------

    def submit(self, op: Callable[[C], T], *, durable: bool = True) -> WriteFuture[T]:
        """Queue ``op`` for the next commit; the future resolves once it is committed
        (and on disk, when ``durable``).

        When nothing is waiting or committing and the caller is not an event loop, the
        caller commits ``op`` itself, at once: a lone writer pays no hand-off to the writer
        thread and back (two context switches, more than a NORMAL commit costs). Otherwise
        ``op`` waits for the writer thread's next batch, so concurrent writers still share
        commits, and operations never overtake ones submitted before them.
        """
        if self._closed:
            raise self._unavailable(f"{self.path} is closed")
        fut: WriteFuture[T] = WriteFuture()
        item = (op, fut, durable)
        if asyncio._get_running_loop() is None and self._take_inline():
            try:
                assert self._conn is not None
                self._commit(self._conn, self._ctx, [item])
            finally:
                self._release_inline()
        else:
            self._enqueue(item)
        return fut

    def submit_async(self, op: Callable[[C], T], *, durable: bool = True) -> asyncio.Future[T]:
        """Like ``submit``, awaited on the running loop without a thread hop (the commit
        itself always runs on the writer thread: an fsync must not block the loop)."""
        if self._closed:
            raise self._unavailable(f"{self.path} is closed")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._enqueue((op, LoopWaiter(loop, fut), durable))
        return fut

    def submit_later(self, op: Callable[[C], T], *, durable: bool = True) -> WriteFuture[T]:
        """Like ``submit``, but always for the writer thread, never committed by the caller:
        upkeep that nobody waits for (an operation may queue it for later, off its
        caller's path), committed with whatever is waiting then."""
        if self._closed:
            raise self._unavailable(f"{self.path} is closed")
        fut: WriteFuture[T] = WriteFuture()
        self._enqueue((op, fut, durable))
        return fut

    def write(self, op: Callable[[C], T], *, durable: bool = True) -> T:
        return self.submit(op, durable=durable).result()

    def close(self) -> None:
        if self._closed:
            return
        with self._mu:
            self._closed = self._queue.stopping = True
            self._queue.cv.notify()
        self._thread.join(timeout=10)
        if not self._thread.is_alive():  # else a commit may still hold it
            self._write_lock.close()

    def _enqueue(self, item: Item) -> None:
        self._queue.put(item)

    def _take_inline(self) -> bool:
        with self._mu:
            if self._busy or self._queue.pending or self._queue.stopping:
                return False
            self._busy = True
            return True

    def _release_inline(self) -> None:
        with self._mu:
            self._busy = False
            if self._queue.pending or self._queue.stopping:  # queued meanwhile, or close()
                self._queue.cv.notify()

    # -- the writer thread ----------------------------------------------------------------

    def _main(self, open: Callable[[], sqlite3.Connection], ready: Future[None]) -> None:
        try:
            conn = open()
        except BaseException as exc:
            ready.set_exception(exc)
            return
        self._conn, self._ctx = conn, self._context(conn)
        ready.set_result(None)
        while True:
            with self._mu:
                batch = self._queue.next_batch(lambda: self._busy)
                if batch is None:
                    break  # stopping, and everything submitted before close() is written
                self._busy = True
            try:
                self._commit(conn, self._ctx, batch)
            finally:
                with self._mu:
                    self._busy = False
        conn.close()

    def _file_is_ours(self) -> bool:
        try:
            return os.stat(self.path).st_ino == self._inode
        except OSError:
            return False

    def _set_synchronous(self, conn: sqlite3.Connection, level: str) -> None:
        # Between transactions only: the level applies to the next COMMIT of this connection.
        if level != self._synchronous:
            conn.execute(f"PRAGMA synchronous = {level}")
            self._synchronous = level

    def _commit(self, conn: sqlite3.Connection, context: C, batch: Batch) -> None:
        live, durable = wanted(batch)
        if not live:
            return
        if not self._file_is_ours():
            err = self._unavailable(
                f"{self.path} was removed or replaced; refusing to write into a file nobody "
                "can read again"
            )
            self.failed(live, err)
            return
        try:
            with self._write_lock:  # other processes' writers queue here, not in SQLite
                live, durable = self._joined(live, durable)
                self._set_synchronous(conn, "FULL" if durable else "NORMAL")
                outcomes = self._transaction(conn, context, live)
        except sqlite3.Error as exc:
            err = self._unavailable(f"write to {self.path} failed, nothing was written: {exc}")
            self.failed(live, err)
            return
        self.committed(live, durable, outcomes)

    def _joined(self, live: Live, durable: bool) -> tuple[Live, bool]:
        """``live`` and the operations queued since it was taken (most while it waited for
        the file's lock: another process was committing), in order and up to the batch
        limit: one commit, one fsync for them all. Nobody else takes from the queue while
        this writer is busy, and whatever is queued was submitted after ``live``."""
        with self._mu:
            pending = self._queue.pending
            room = max(0, self._queue.max_batch - len(live))
            more = [pending.popleft() for _ in range(min(len(pending), room))]
        if not more:
            return live, durable
        joined, joined_durable = wanted(more)
        return live + joined, durable or joined_durable

    def _transaction(self, conn: sqlite3.Connection, context: C, live: Live) -> list[Outcome]:
        """Run ``live`` and commit; on a SQLite error roll back, then raise it."""
        try:
            outcomes = self._run(conn, context, live, isolate=False)
            if outcomes is None:
                outcomes = self._run(conn, context, live, isolate=True)
                assert outcomes is not None  # an isolated run never asks to run again
            conn.execute("COMMIT")
        except sqlite3.Error:
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    log.exception("rollback after a failed commit of %s failed", self.path)
            raise
        return outcomes

    @staticmethod
    def _run(
        conn: sqlite3.Connection, context: Any, live: Live, *, isolate: bool
    ) -> list[Outcome] | None:
        """Run every operation in one open transaction; None means "run again isolated"."""
        outcomes: list[Outcome] = []
        conn.execute("BEGIN IMMEDIATE")
        for op, waiter in live:
            if isolate:
                conn.execute("SAVEPOINT op")
            changes_before = conn.total_changes
            try:
                result = op(context)
            except Exception as exc:  # the operation fails alone; its siblings still commit
                if isolate:
                    conn.execute("ROLLBACK TO op")
                    conn.execute("RELEASE op")
                elif conn.total_changes != changes_before:
                    conn.execute("ROLLBACK")
                    return None
                outcomes.append((waiter, False, exc))
            else:
                if isolate:
                    conn.execute("RELEASE op")
                outcomes.append((waiter, True, result))
        return outcomes
