"""Group commit for the PostgreSQL session store: the writes coroutines are waiting for, run
by a few writer threads, each taking every write that is waiting as one transaction; and
the reads they wait for, batched the same way.

A turn's write on its own costs a pool checkout, a hop to an executor thread and back, and
two round trips (BEGIN, the locks and its first read; COMMIT with its fsync). A batch of n
pays one checkout, one hop out and one wake-up of each event loop, and when its operations
take disjoint locks (n turns of n conversations) two round trips: BEGIN, every lock and
every operation's first read (found by a dry run, ``first_read``) in one, then their
writes and one COMMIT (one WAL flush). Operations that share a lock run one after the
other instead, each one's writes travelling with the next one's first read: n + 1 trips.

The locks of a batch are taken in one statement, in the order of their hashes, and so is
every lock set of a single write (``SQL_LOCK_KEYS``): writers that take several locks
(a batch here, or another server's) always take them in the same order, so advisory locks
cannot deadlock. Operations run one after the other in the order they were queued, each
seeing what the ones before it wrote, exactly as if each ran alone in that order.

Reads are queued the same way to reader threads (``SessionReads``): the first statement of
every read waiting goes to the server in one pipeline, so a batch of new conversations'
lookups is one trip, not one each.

A batch never decides what a failure means. When an operation raises, or a statement
fails, the batch is rolled back with nothing written and each of its operations runs again
on its own (``alone``: the store's single write, with its own retry on a dropped
connection), so each gets exactly the outcome it would have had without batching. Only a
connection lost while COMMIT was on its way leaves the outcome unknown: then every waiter
hears that, as a single write's caller would.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
import psycopg_pool

from delivery.session_rows import SessionRows
from storage.group_commit import BatchQueue, Live, wanted
from storage.postgres import sql as q
from storage.postgres.tx import rollback_quietly
from storage.waiters import LoopWaiter, Outcome, resolve

__all__ = ["SessionBatches", "SessionReads"]

T = TypeVar("T")
log = logging.getLogger(__name__)

# An operation and the locks it takes: what a batch item carries.
Write = tuple[tuple[str, ...], Callable[[SessionRows], Any]]
# The ``SessionRows`` of an operation in a batch: its connection, in pipeline mode, the
# answer to its first read when that was sent ahead, and the rows of the operation before it
# (None for the first), whose held-back inserts it goes on holding; ``flush`` sends them.
Rows = Callable[[psycopg.Connection[Any], psycopg.Pipeline, Any, Any], Any]
FirstRead = Callable[[Callable[[SessionRows], Any]], tuple[str, tuple[Any, ...]] | None]


class _RunAlone(Exception):
    """The batch is rolled back, nothing written: each operation runs on its own."""


class _Lost(Exception):
    """COMMIT's answer was lost with the connection: ``error`` is what every waiter hears."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class _Threads:
    """A queue of coroutines' operations and the threads that take them in batches:
    ``_run`` answers a batch's waiters."""

    def __init__(self, closed: Callable[[], Exception], *, threads: int, name: str) -> None:
        self._closed = closed
        self._queue = BatchQueue(max_batch=64)
        self._waking: set[asyncio.AbstractEventLoop] = set()  # loops that will wake a thread
        self._threads = [
            threading.Thread(target=self._serve, name=f"{name}-{i}", daemon=True)
            for i in range(max(threads, 1))
        ]
        for t in self._threads:
            t.start()

    def _submit(self, item: Any) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        queue = self._queue
        with queue.cv:
            if queue.stopping:
                raise self._closed()
            queue.pending.append((item, LoopWaiter(loop, fut), True))
            if loop in self._waking:
                return fut
            self._waking.add(loop)
        # A thread is woken once for everything this loop queues until its next turn, not
        # once per operation: waking one costs the loop more than queueing does.
        loop.call_soon(self._wake, loop)
        return fut

    def _wake(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._queue.cv:
            self._waking.discard(loop)
            # One idle thread is enough (any of them takes any batch), and none is woken
            # while all are busy: each looks at the queue again when it is done.
            self._queue.cv.notify()

    def close(self) -> None:
        """Let the threads finish what is queued, and wait for them."""
        with self._queue.cv:
            self._queue.stopping = True
            self._queue.cv.notify_all()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join()

    def _serve(self) -> None:
        while True:
            with self._queue.cv:
                batch = self._queue.next_batch(lambda: False)
            if batch is None:
                return
            live, _ = wanted(batch)
            if not live:
                continue
            try:
                self._run(live)
            except BaseException:  # never leave a waiter hanging, whatever happened
                log.exception("%s failed", threading.current_thread().name)
                resolve([(w, False, self._closed()) for _, w in live])

    def _run(self, live: Live) -> None:
        raise NotImplementedError


class SessionReads(_Threads):
    """The read queue of one session store and its reader threads: a reader answers every
    read waiting on one pooled connection (autocommit, as a single read) and wakes each
    event loop once per batch. The first statement of each read goes to the server
    together, in one pipeline (``first_read`` finds it by a dry run); each read then runs
    with its first answer at hand, and any further statement of its own one trip each. A
    read the driver fails, and every one after it in the batch, runs again as the store's
    single read (``alone``, with its retry on a dropped connection)."""

    def __init__(
        self,
        pool: Callable[[], psycopg_pool.ConnectionPool[Any]],
        rows: Callable[[psycopg.Connection[Any], Any], SessionRows],
        first_read: FirstRead,
        alone: Callable[[Callable[[SessionRows], Any]], Any],
        closed: Callable[[], Exception],
        *,
        readers: int = 2,
    ) -> None:
        self._pool = pool
        self._rows = rows
        self._first_read = first_read
        self._alone = alone
        super().__init__(closed, threads=readers, name="pg-session-reads")

    def submit(self, op: Callable[[SessionRows], T]) -> asyncio.Future[T]:
        return self._submit(op)

    def _run(self, live: Live) -> None:
        outcomes: list[Outcome] = []
        firsts = [self._first_read(op) for op, _ in live] if len(live) > 1 else [None]
        # A driver's failure ends the batch's run: what is left runs alone.
        with (
            contextlib.suppress(psycopg.Error, psycopg_pool.PoolTimeout),
            self._pool().connection() as conn,
        ):
            aheads: list[Any] = [None] * len(live)
            if any(first is not None for first in firsts):
                with conn.pipeline():  # one trip for every first read
                    for i, first in enumerate(firsts):
                        if first is not None:
                            aheads[i] = (*first, conn.execute(first[0], first[1]))
            for (op, waiter), ahead in zip(live, aheads, strict=True):
                try:
                    outcomes.append((waiter, True, op(self._rows(conn, ahead))))
                except psycopg.Error:
                    raise
                except Exception as exc:
                    outcomes.append((waiter, False, exc))
        for op, waiter in live[len(outcomes) :]:
            try:
                outcomes.append((waiter, True, self._alone(op)))
            except Exception as exc:
                outcomes.append((waiter, False, exc))
        resolve(outcomes)


class SessionBatches(_Threads):
    """The write queue of one session store and its writer threads (see the module docstring).

    ``pool`` lends each batch its connection; ``rows`` makes the ``SessionRows`` of a
    connection in pipeline mode (and says, by its ``answered``, whether an answer came back);
    ``alone`` runs one operation as the store's single write; ``closed`` builds the error for
    a write queued after ``close``, ``lost`` the one for a batch whose COMMIT's answer was
    lost with its connection.
    """

    def __init__(
        self,
        pool: Callable[[], psycopg_pool.ConnectionPool[Any]],
        rows: Rows,
        first_read: FirstRead,
        alone: Callable[[tuple[str, ...], Callable[[SessionRows], Any]], Any],
        closed: Callable[[], Exception],
        lost: Callable[[Exception], Exception],
        *,
        writers: int = 2,
    ) -> None:
        self._pool = pool
        self._rows = rows
        self._first_read = first_read
        self._alone = alone
        self._lost = lost
        self.batches = 0  # transactions of more than one write
        self.batched = 0  # the writes they committed
        super().__init__(closed, threads=writers, name="pg-session-writes")

    def submit(self, locks: tuple[str, ...], op: Callable[[SessionRows], T]) -> asyncio.Future[T]:
        return self._submit((locks, op))

    def _run(self, live: Live) -> None:
        if len(live) > 1:
            try:
                outcomes = self._run_batch(live)
            except _RunAlone:
                pass
            except _Lost as lost:  # COMMIT's answer was lost: nobody knows what holds
                exc = lost.error
                resolve([(waiter, False, exc) for _, waiter in live])
                return
            else:
                self.batches += 1
                self.batched += len(live)
                resolve(outcomes)
                return
        resolve([self._one_alone(write, waiter) for write, waiter in live])

    def _one_alone(self, write: Write, waiter: Any) -> Outcome:
        locks, op = write
        try:
            return waiter, True, self._alone(locks, op)
        except Exception as exc:
            return waiter, False, exc

    def _firsts(self, live: Live) -> list[tuple[str, tuple[Any, ...]] | None]:
        """Each operation's first read, to send ahead; none when two operations share a
        lock or one takes none. A rule reads only rows under its own locks, so with
        disjoint locks no operation's first read can see what another of the batch
        writes: sent before any of those writes, it answers exactly as it would after."""
        seen: set[str] = set()
        for (locks, _op), _waiter in live:
            if not locks or seen.intersection(locks):
                return [None] * len(live)
            seen.update(locks)
        return [self._first_read(op) for (_locks, op), _waiter in live]

    def _run_batch(self, live: Live) -> list[Outcome]:
        keys = sorted({key for (locks, _op), _w in live for key in locks})
        firsts = self._firsts(live)
        committing = False
        try:
            with self._pool().connection() as conn:
                try:
                    aheads: list[Any] = [None] * len(live)
                    answered = any(first is not None for first in firsts)
                    # One pipeline for the whole batch (entering and leaving one costs the
                    # driver's Python more than a statement does).
                    with conn.pipeline() as pipeline:
                        self._begin(conn, keys)
                        if answered:
                            # BEGIN, the locks and every operation's first read: one trip.
                            for i, first in enumerate(firsts):
                                if first is not None:
                                    aheads[i] = (*first, conn.execute(first[0], first[1]))
                            pipeline.sync()
                        outcomes: list[Outcome] = []
                        rows: Any = None
                        for ((_locks, op), waiter), ahead in zip(live, aheads, strict=True):
                            # Each operation's rows share what the one before held back.
                            rows = self._rows(conn, pipeline, ahead, rows)
                            try:
                                outcomes.append((waiter, True, op(rows)))
                            except psycopg.Error:
                                raise
                            except Exception as exc:
                                # Whether it wrote before raising is not known here: its
                                # outcome is the one it gets alone.
                                raise _RunAlone from exc
                            answered = answered or rows.answered
                        rows.flush()  # the batch's held inserts: one statement
                        if not answered:
                            pipeline.sync()  # a dropped connection shows here, not at COMMIT
                        committing = True
                        conn.execute("COMMIT")
                except BaseException as exc:
                    if committing and conn.broken and isinstance(exc, psycopg.Error):
                        # The connection went while COMMIT was on its way.
                        raise _Lost(self._lost(exc)) from exc
                    rollback_quietly(conn)
                    raise
        except (psycopg.Error, psycopg_pool.PoolTimeout):
            # The server answered with an error, so nothing was committed (a statement
            # failed, a deadlock with another kind of writer), or no connection came.
            raise _RunAlone from None
        return outcomes

    @staticmethod
    def _begin(conn: psycopg.Connection[Any], keys: list[str]) -> None:
        conn.execute("BEGIN")
        if keys:
            conn.execute(q.SQL_LOCK_KEYS, (keys,))
