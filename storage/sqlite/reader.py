"""Batched reads for SQLite: one reader thread answers every waiting coroutine's read at once.

An event loop must not run a query itself, and ``asyncio.to_thread`` per read costs a
hand-off to an executor thread and a wake-up of the loop for every single read; under a
few dozen concurrent turns those hand-offs, not the queries, were the session store's
cost. The reader thread instead takes every read that is waiting, runs them one after the
other in a single read transaction (so each sees a consistent snapshot, no older than the
moment the batch began) and wakes each event loop once per batch, the way the group-commit
writer (``storage.sqlite.writer``) wakes it once per commit. Reads never wait for an
fsync and never take the write lock.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from storage.waiters import LoopWaiter, Outcome, resolve

__all__ = ["GroupReader"]

T = TypeVar("T")
log = logging.getLogger(__name__)


class GroupReader:
    """The batched reader of one SQLite file (see the module docstring).

    ``open`` runs on the reader thread and returns its connection; ``classify`` turns a
    ``sqlite3.Error`` into the exception callers get; ``unavailable`` builds the error for
    reads submitted after ``close``.
    """

    def __init__(
        self,
        open: Callable[[], sqlite3.Connection],
        *,
        classify: Callable[[sqlite3.Error], Exception],
        unavailable: Callable[[str], Exception],
        name: str = "sqlite-reader",
        max_batch: int = 256,
    ) -> None:
        self._classify = classify
        self._unavailable = unavailable
        self._max_batch = max_batch
        self._mu = threading.Lock()
        self._wake = threading.Condition(self._mu)
        self._pending: collections.deque[tuple[Callable[[sqlite3.Connection], Any], Any]] = (
            collections.deque()
        )
        self._closed = False
        # True while the reader thread waits for work (set and cleared under ``_mu``): a read
        # submitted while it is busy is only appended, with no lock taken on the event loop;
        # the thread looks at the queue again before it waits.
        self._idle = False
        self.batches = 0
        self.reads = 0
        ready: Future[None] = Future()
        self._thread = threading.Thread(
            target=self._main, args=(open, ready), name=name, daemon=True
        )
        self._thread.start()
        ready.result()

    def submit_async(self, op: Callable[[sqlite3.Connection], T]) -> asyncio.Future[T]:
        """Run ``op`` (a function of the connection) on the reader thread; await its result."""
        if self._closed:
            raise self._unavailable("the reader is closed")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        item = (op, LoopWaiter(loop, fut))
        self._pending.append(item)  # a deque: safe from any thread
        if self._closed:
            # Closed meanwhile: the thread may have made its last look at the queue. Taken
            # back, the read is refused; already taken, the thread answers it.
            try:
                self._pending.remove(item)
            except ValueError:
                return fut
            raise self._unavailable("the reader is closed")
        if self._idle:
            with self._mu:
                self._wake.notify()
        return fut

    def close(self) -> None:
        with self._mu:
            if self._closed:
                return
            self._closed = True
            self._wake.notify()
        self._thread.join(timeout=10)

    def _main(self, open: Callable[[], sqlite3.Connection], ready: Future[None]) -> None:
        try:
            conn = open()
        except BaseException as exc:
            ready.set_exception(exc)
            return
        ready.set_result(None)
        try:
            while True:
                if not self._pending:
                    with self._mu:
                        self._idle = True
                        while not self._pending and not self._closed:
                            self._wake.wait()
                        self._idle = False
                    if not self._pending:
                        break  # closed, and every read submitted before was answered
                batch: list[tuple[Callable[[sqlite3.Connection], Any], Any]] = []
                # A read refused by a close may leave the queue meanwhile.
                with contextlib.suppress(IndexError):
                    while len(batch) < self._max_batch:
                        batch.append(self._pending.popleft())
                resolve(self._run(conn, batch))
        finally:
            conn.close()

    def _run(
        self, conn: sqlite3.Connection, batch: list[tuple[Callable[[sqlite3.Connection], Any], Any]]
    ) -> list[Outcome]:
        live = [(op, w) for op, w in batch if not w.fut.cancelled()]
        outcomes: list[Outcome] = []
        if not live:
            return outcomes
        try:
            conn.execute("BEGIN")
        except sqlite3.Error as exc:
            err = self._classify(exc)
            return [(w, False, err) for _, w in live]
        try:
            for op, waiter in live:
                try:
                    outcomes.append((waiter, True, op(conn)))
                except sqlite3.Error as exc:
                    outcomes.append((waiter, False, self._classify(exc)))
                except Exception as exc:  # the read fails alone
                    outcomes.append((waiter, False, exc))
        finally:
            try:
                conn.execute("COMMIT")
            except sqlite3.Error:
                log.exception("ending a read transaction failed")
        self.batches += 1
        self.reads += len(live)
        return outcomes
