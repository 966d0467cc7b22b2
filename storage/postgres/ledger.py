"""The PostgreSQL ledger: one store for several ``reveille serve`` processes on several hosts.

The same ``LedgerTx`` primitives as SQLite (compare-and-set updates whose ``WHERE`` carries
the expected values: a stale claim's token matches 0 rows), so every rule of
``delivery.ledger`` holds unchanged. Writes are queued to a few writer threads, each with
its own connection; a writer takes every operation waiting and runs them in one
transaction (group commit), so concurrent operations share one WAL flush. An operation that
raises fails alone: the batch is rolled back and run again with a savepoint around each
operation. With one writer (the default) operations commit in the order they were submitted,
as with SQLite, so a caller may queue a creation and its finish without waiting between;
more writers trade that order for parallel batches. Operations whose loss can only cause a
redelivery (``durable=False``) commit with ``synchronous_commit = off`` when a batch holds
nothing else. A batch whose operations are one statement each goes to the server in one
pipeline (``storage.postgres.tx``): two round trips instead of one per statement. Coroutines
await their write on the loop without any I/O on the loop thread. Reads come from a
connection pool.

Wake-ups go through ``LISTEN/NOTIFY`` (``storage.postgres.notifier``); the schema is built
by versioned migrations (``storage.postgres.migrations``) applied under an advisory lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import psycopg
import psycopg_pool

from delivery.backend import LedgerTx
from delivery.errors import LedgerUnavailable
from delivery.peers import ServerRecord
from delivery.rows import AuditEntry, LedgerRow, PendingCounts, PrunedRow, RowQuery, SettledRow
from delivery.write_future import WriteFuture
from storage.group_commit import Batch, BatchQueue, CommitCounts, Item, Live, wanted
from storage.postgres import sql as sql
from storage.postgres.conn import (
    PLACEHOLDER,
    PostgresUnavailable,
    check_url,
    connect,
    explain,
    open_pool,
    redact,
)
from storage.postgres.notifier import PostgresNotifier, channel_for
from storage.postgres.tx import PgTx, rollback_quietly, run_each, run_pipelined
from storage.sql import (
    PENDING_COUNTS,
    SETTLED,
    TOMBSTONE_COLUMNS,
    GoalSearch,
    decode_row,
    marked,
    pending_counts,
    query_filter,
    settled_page,
)
from storage.waiters import LoopWaiter, Outcome, Waiter

T = TypeVar("T")
log = logging.getLogger(__name__)

_SETTLED = marked(SETTLED, "%(before)s")
# A goal's words through the GIN index of migration 13 (``RowQuery.text``)
_GOAL_SEARCH = GoalSearch(sql.LEDGER_GOAL_MATCH, sql.tsquery)
_PENDING_COUNTS = marked(PENDING_COUNTS, PLACEHOLDER)
_SETTLED_PAGE = settled_page(PLACEHOLDER)
# One statement: the rows go, their audit entries with them, and each leaves a tombstone.
_SQL_PRUNE = f"""
WITH gone AS (
    DELETE FROM deliveries WHERE id = ANY(%(ids)s) AND {_SETTLED}
    RETURNING id, kind, state, delivery_state, session_key, completed_at, settled_at
), audit AS (
    DELETE FROM delivery_audit WHERE delivery_id IN (SELECT id FROM gone)
), tombs AS (
    INSERT INTO delivery_tombstones ({TOMBSTONE_COLUMNS})
    SELECT id, kind, state, delivery_state, session_key, completed_at, settled_at,
           %(at)s, %(reason)s FROM gone
    ON CONFLICT (id) DO UPDATE SET pruned_at = EXCLUDED.pruned_at, reason = EXCLUDED.reason
)
SELECT count(*) FROM gone
"""
_SQL_TAKE_LEASE = (
    "INSERT INTO leases (name, holder, expires_at) VALUES (%s, %s, %s)"
    " ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at"
    " WHERE leases.expires_at <= %s OR leases.holder = EXCLUDED.holder"
)

_BEGIN_RELAXED = "BEGIN; SET LOCAL synchronous_commit = off"
_DUE_SCAN_ONLY = "SET LOCAL enable_bitmapscan = off"
_ANY_SCAN = "SET LOCAL enable_bitmapscan = on"
_RETRYABLE = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)
# A batch of one operation saves only its BEGIN's round trip by a pipeline, and measured
# slower under concurrency (psycopg's pipeline mode waits differently): it runs plainly.
_PIPELINE_MIN = 2


class PostgresBackend(CommitCounts):
    """``LedgerBackend`` and ``LedgerViews`` on a PostgreSQL database (see the module
    docstring)."""

    def __init__(
        self,
        url: str,
        *,
        writers: int = 1,
        max_batch: int = 512,
        pool_size: int = 4,
        schema: str,
        pipelined: bool = True,
    ) -> None:
        check_url(url)
        super().__init__()
        self._url = url
        self.schema = schema
        # Batches sent as one pipeline (``storage.postgres.tx``); off only to measure it.
        self.pipelined = pipelined
        self.pipelined_commits = 0
        self.apart_commits = 0  # ``write(apart=True)``: beside the writers' batches
        # Operations waiting; its ``cv`` also guards each writer slot's ``busy``.
        self._queue = BatchQueue(max_batch)
        # No checking trip per checkout (a scheduler pass makes several reads): a read
        # that finds its connection dropped has the pool check the rest and runs again.
        self._pool: psycopg_pool.ConnectionPool[Any] = open_pool(
            url, name="reveille-ledger", max_size=pool_size, check=False
        )
        self._notifier = PostgresNotifier(url, channel_for(schema), self._pool)
        self._slots = [_Slot(connect(url)) for _ in range(max(writers, 1))]
        self._threads = [
            threading.Thread(target=self._writer, args=(slot,), name=f"pg-writer-{i}", daemon=True)
            for i, slot in enumerate(self._slots)
        ]
        for t in self._threads:
            t.start()

    @property
    def url(self) -> str:
        return redact(self._url)

    @property
    def notifier(self) -> PostgresNotifier:
        return self._notifier

    # -- writes ---------------------------------------------------------------------------

    def _enqueue(self, item: Item) -> None:
        with self._queue.cv:
            if self._queue.stopping:
                raise LedgerUnavailable(f"the ledger {self.url} is closed")
            self._queue.put(item)

    def submit(self, op: Callable[[LedgerTx], T], *, durable: bool = True) -> WriteFuture[T]:
        """Queue ``op``; a thread (never an event loop) that finds nothing waiting and a
        writer idle commits it itself, at once: a lone writer pays no hand-off to the writer
        thread and back. Nothing queued is ever overtaken."""
        fut: WriteFuture[T] = WriteFuture()
        item = (op, fut, durable)
        slot = self._take_inline() if asyncio._get_running_loop() is None else None
        if slot is None:
            self._enqueue(item)
            return fut
        self._run_on(slot, [item], "ledger write")
        return fut

    def _take_inline(self) -> _Slot | None:
        with self._queue.cv:
            if self._queue.pending or self._queue.stopping:
                return None
            for slot in self._slots:
                if not slot.busy:
                    slot.busy = True
                    return slot
        return None

    def submit_async(
        self, op: Callable[[LedgerTx], T], *, durable: bool = True
    ) -> asyncio.Future[T]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._enqueue((op, LoopWaiter(loop, fut), durable))
        return fut

    def write(self, op: Callable[[LedgerTx], T], *, durable: bool = True, apart: bool = False) -> T:
        if apart:
            return self._write_apart(op, durable)
        return self.submit(op, durable=durable).result()

    def _write_apart(self, op: Callable[[LedgerTx], T], durable: bool) -> T:
        """``op`` in a transaction of its own on a pooled connection, beside the writers'
        batches (``LedgerBackend.write``'s ``apart``). Queued, a re-offer pass over a burst
        of due timers waited for the batch of claims in flight, and then, being more than one
        statement, made the next batch give up its pipeline: a round trip per claim."""

        def run(conn: psycopg.Connection[Any]) -> T:
            # One round trip opens the transaction (and relaxes the commit when it may).
            conn.execute(_BEGIN_RELAXED if not durable else "BEGIN")
            return op(PgTx(conn))

        return self._apart(run)

    def write_due(
        self,
        now: float,
        limit: int,
        op: Callable[[LedgerTx, list[LedgerRow]], T],
        *,
        durable: bool = True,
    ) -> T:
        """``op`` written apart (``write``'s ``apart``), handed the pending rows due at
        ``now`` (at most ``limit``, earliest first) that no other transaction is working on,
        read and locked by the transaction's first statement, in the round trip that opens
        it (``delivery.ledger_recovery.DueLocking``). A re-offer batch read its rows, then
        opened its transaction, then locked them: three round trips and two scans of the
        due index where one does, which with ten thousand timers due at once was most of
        their firing lateness."""

        def run(conn: psycopg.Connection[Any]) -> T:
            with conn.pipeline():
                conn.execute("BEGIN")
                if not durable:
                    conn.execute("SET LOCAL synchronous_commit = off")
                # Through the due index, in its order, stopping at ``limit`` (see
                # ``sql.LEDGER_DUE_LOCKED``); the statements after it are planned as usual.
                conn.execute(_DUE_SCAN_ONLY)
                cur = conn.cursor().execute(sql.LEDGER_DUE_LOCKED, (now, int(limit)), prepare=True)
                conn.execute(_ANY_SCAN)
            rows = [decode_row(r) for r in cur.fetchall()]
            return op(PgTx(conn, locked=[row.id for row in rows]), rows)

        return self._apart(run)

    def write_locked(
        self,
        row_ids: list[str],
        op: Callable[[LedgerTx], T],
        *,
        durable: bool = True,
    ) -> T:
        """``op`` written apart, with those of ``row_ids`` no other transaction is working on
        locked by the round trip that opens its transaction (``DueLocking.write_locked``):
        rows read ahead of their due time are offered in as many trips as ``write_due``
        takes, none of them spent reading and decoding the rows again."""

        def run(conn: psycopg.Connection[Any]) -> T:
            with conn.pipeline():
                conn.execute("BEGIN")
                if not durable:
                    conn.execute("SET LOCAL synchronous_commit = off")
                cur = conn.cursor().execute(sql.LEDGER_LOCK_SKIP_LOCKED, (row_ids,), prepare=True)
            locked = {r[0] for r in cur.fetchall()}
            return op(PgTx(conn, locked=locked, busy=set(row_ids) - locked))

        return self._apart(run)

    def _apart(self, run: Callable[[psycopg.Connection[Any]], T]) -> T:
        """``run`` (which opens the transaction) then COMMIT on a pooled connection, run
        again when it crossed another transaction."""
        if self._queue.stopping:
            raise LedgerUnavailable(f"the ledger {self.url} is closed")
        for attempt in range(6):
            try:
                with self._pool.connection() as conn:
                    try:
                        result = run(conn)
                        conn.execute("COMMIT")
                    except BaseException:
                        rollback_quietly(conn)
                        raise
                self.apart_commits += 1
                return result
            except _RETRYABLE as exc:  # crossed another transaction: nothing was written
                log.info("ledger write retried after %s (attempt %d)", type(exc).__name__, attempt)
            except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
                raise LedgerUnavailable(
                    f"write to the ledger {self.url} failed, nothing was written: "
                    f"{explain(exc, self._url)}"
                ) from exc
        raise LedgerUnavailable(f"write to the ledger {self.url} kept crossing others")

    def _writer(self, slot: _Slot) -> None:
        while True:
            with self._queue.cv:
                batch = self._queue.next_batch(lambda: slot.busy)
                if batch is None:
                    break
                slot.busy = True
            self._run_on(slot, batch, "ledger writer")
        with contextlib.suppress(Exception):
            slot.conn.close()

    def _run_on(self, slot: _Slot, batch: Batch, what: str) -> None:
        """Commit ``batch`` on the taken ``slot`` (a broken connection is replaced), then
        free the slot: another writer may take what was queued meanwhile (and ``close`` may
        be waiting for it)."""
        try:
            self._commit(slot, batch)
        except Exception:
            log.exception("%s failed", what)
            if slot.conn.closed or slot.conn.broken:
                self._reconnect(slot)
        finally:
            self._free(slot)

    def _free(self, slot: _Slot) -> None:
        with self._queue.cv:
            slot.busy = False
            if self._queue.pending or self._queue.stopping:
                self._queue.cv.notify_all()

    def _reconnect(self, slot: _Slot) -> None:
        with contextlib.suppress(Exception):
            slot.conn.close()
        while True:
            try:
                slot.reset(connect(self._url))
                return
            except PostgresUnavailable as exc:
                if self._queue.stopping:
                    raise
                log.warning("ledger writer reconnecting: %s", exc)
                threading.Event().wait(1.0)

    def _commit(self, slot: _Slot, batch: Batch) -> None:
        conn, tx = slot.conn, slot.tx
        live, durable = wanted(batch)
        if not live:
            return
        outcomes: list[Outcome] | None = None
        err: Exception | None = None
        isolate = False
        reconnected = False
        for attempt in range(6):
            try:
                if not isolate and self.pipelined and len(live) >= _PIPELINE_MIN:
                    # Two round trips when every operation is one statement, not n + 2;
                    # None: one was not, and nothing was written.
                    outcomes = run_pipelined(conn, tx, live, durable)
                    if outcomes is not None:
                        self.pipelined_commits += 1
                        break
                outcomes = self._run(conn, tx, live, durable, isolate=isolate)
                if outcomes is None:  # an operation raised after writing: isolate each
                    isolate = True
                    continue
                break
            except _RETRYABLE as exc:  # two processes' batches crossed: run again
                err = exc
                log.info("ledger batch retried after %s (attempt %d)", type(exc).__name__, attempt)
            except psycopg.Error as exc:
                err = exc
                if conn.broken or conn.closed:
                    # Terminated by the server (a restart, a failover): it said so before
                    # any COMMIT of the batch completed, so nothing was written; run it once
                    # more on a fresh connection instead of failing it.
                    if reconnected or not isinstance(exc, psycopg.errors.AdminShutdown):
                        break
                    reconnected = True
                    try:
                        slot.reset(connect(self._url))
                    except PostgresUnavailable:
                        break
                    conn, tx = slot.conn, slot.tx
                    log.info("ledger writer reconnected after the server ended its session")
                    continue
                isolate = True  # a statement failed: find the operation it belongs to
        if outcomes is None:
            unavailable = LedgerUnavailable(
                f"write to the ledger {self.url} failed, nothing was written: "
                f"{' '.join(str(err).split())}"
            )
            self.failed(live, unavailable)
            if conn.broken or conn.closed:
                raise PostgresUnavailable("the writer's connection broke")
            return
        self.committed(live, durable, outcomes)

    @staticmethod
    def _run(
        conn: psycopg.Connection[Any],
        tx: PgTx,
        live: Live,
        durable: bool,
        *,
        isolate: bool,
    ) -> list[Outcome] | None:
        # One round trip opens the transaction (and relaxes the commit when it may).
        conn.execute(_BEGIN_RELAXED if not durable else "BEGIN")
        try:
            if isolate:
                outcomes: list[Outcome] | None = [
                    _run_in_savepoint(conn, tx, op, waiter) for op, waiter in live
                ]
            else:
                outcomes = run_each(conn, tx, live)
            if outcomes is not None:
                conn.execute("COMMIT")
        except BaseException:
            rollback_quietly(conn)
            raise
        return outcomes

    # -- reads -----------------------------------------------------------------------------

    def _fetch(self, query: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        if self._queue.stopping:
            raise LedgerUnavailable(f"the ledger {self.url} is closed")
        params = list(params)
        for attempt in (1, 2):
            try:
                with self._pool.connection() as conn:
                    return conn.execute(query, params, prepare=True).fetchall()
            except psycopg.OperationalError as exc:
                # A pooled connection the server dropped (a restart, a failover): the pool
                # discards it and checks its idle siblings, most likely dropped with it; a
                # read is safe to run once more on a live one.
                if attempt == 2:
                    raise LedgerUnavailable(
                        f"ledger read failed: {explain(exc, self._url)}"
                    ) from exc
                with contextlib.suppress(psycopg.Error):
                    self._pool.check()
            except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
                raise LedgerUnavailable(f"ledger read failed: {explain(exc, self._url)}") from exc
        raise AssertionError("unreachable")

    def _rows(self, query: str, params: Iterable[Any] = ()) -> list[LedgerRow]:
        return [decode_row(r) for r in self._fetch(query, params)]

    def _scalars(self, query: str, params: Iterable[Any] = ()) -> list[Any]:
        return [r[0] for r in self._fetch(query, params)]

    def get(self, row_id: str) -> LedgerRow | None:
        rows = self._rows(sql.LEDGER_GET, (row_id,))
        return rows[0] if rows else None

    def query(self, query: RowQuery) -> list[LedgerRow]:
        where, params = query_filter(PLACEHOLDER, query, _GOAL_SEARCH)
        text = sql.LEDGER_SELECT + where
        text += f" ORDER BY seq {'ASC' if query.oldest_first else 'DESC'} LIMIT %s"
        params.append(max(int(query.limit), 0))
        return self._rows(text, params)

    def pending_with_event(self, limit: int) -> list[LedgerRow]:
        return self._rows(sql.LEDGER_PENDING_WITH_EVENT, (int(limit),))

    def due(self, now: float, limit: int) -> list[LedgerRow]:
        return self._rows(sql.LEDGER_DUE, (now, int(limit)))

    def next_due_at(self) -> float | None:
        found = self._scalars(sql.LEDGER_NEXT_DUE)
        return found[0] if found else None

    def pending_holders(self) -> list[str]:
        return self._scalars(sql.LEDGER_PENDING_HOLDERS)

    def active_owners(self, state: str) -> list[str]:
        return self._scalars(sql.LEDGER_ACTIVE_OWNERS, (state,))

    def rows_held_by(self, holder: str, limit: int) -> list[LedgerRow]:
        return self._rows(sql.LEDGER_HELD_BY, (holder, int(limit)))

    def rows_owned_by(self, owner: str, state: str, limit: int) -> list[LedgerRow]:
        return self._rows(sql.LEDGER_OWNED_BY, (state, owner, int(limit)))

    def audit_log(self, row_id: str) -> list[AuditEntry]:
        return [
            {"at": at, "action": a, "detail": d}
            for at, a, d in self._fetch(sql.LEDGER_AUDIT, (row_id,))
        ]

    def servers(self) -> list[ServerRecord]:
        return [ServerRecord(*row) for row in self._fetch(sql.SERVERS_SELECT)]

    def delivery_counts(self) -> dict[str, int]:
        """Rows waiting for delivery, and those of them under a claim (``LedgerViews``)."""
        found = self._fetch(sql.LEDGER_DELIVERY_COUNTS)
        pending, claimed = found[0] if found else (0, 0)
        return {"pending": int(pending or 0), "claimed": int(claimed or 0)}

    def pending_counts(self, now: float) -> PendingCounts:
        return pending_counts(self._fetch(_PENDING_COUNTS, (now,)))

    # -- retention (``LedgerRetention``) ---------------------------------------------------
    # Its writes run on a pooled connection of their own, beside the writer threads: each is
    # one statement whose WHERE re-checks what it may touch, so it needs no place in their
    # batches (and a batch of thousands of deletes would hold up the deliveries there).

    def _retention_write(self, query: str, params: Any) -> int:
        if self._queue.stopping:
            raise LedgerUnavailable(f"the ledger {self.url} is closed")
        try:
            with self._pool.connection() as conn, conn.transaction():
                cur = conn.execute(query, params)
                if cur.description is not None:
                    row = cur.fetchone()
                    return int(row[0]) if row else 0
                return int(cur.rowcount)
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            raise LedgerUnavailable(f"ledger write failed: {explain(exc, self._url)}") from exc

    def settled_before(
        self, before: float, after: SettledRow | None, limit: int
    ) -> list[SettledRow]:
        after_at, after_id = (after.settled_at, after.id) if after else (float("-inf"), "")
        found = self._fetch(_SETTLED_PAGE, (before, before, after_at, after_id, int(limit)))
        return [SettledRow(*r) for r in found]

    def prune_settled(self, ids: list[str], before: float, pruned_at: float, reason: str) -> int:
        if not ids:
            return 0
        params = {"ids": list(ids), "before": before, "at": pruned_at, "reason": reason}
        return self._retention_write(_SQL_PRUNE, params)

    def pruned(self, row_id: str) -> PrunedRow | None:
        found = self._fetch(
            f"SELECT {TOMBSTONE_COLUMNS} FROM delivery_tombstones WHERE id = %s", (row_id,)
        )
        return PrunedRow(*found[0]) if found else None

    def prune_tombstones(self, before: float, limit: int, *, dry_run: bool = False) -> int:
        pick = "SELECT id FROM delivery_tombstones WHERE pruned_at < %s ORDER BY pruned_at LIMIT %s"
        if dry_run:
            return len(self._fetch(pick, (before, int(limit))))
        return self._retention_write(
            f"DELETE FROM delivery_tombstones WHERE id IN ({pick})", (before, int(limit))
        )

    def take_lease(self, name: str, holder: str, now: float, ttl_seconds: float) -> bool:
        return self._retention_write(_SQL_TAKE_LEASE, (name, holder, now + ttl_seconds, now)) == 1

    def stats(self) -> dict[str, int]:
        return {
            "commits": self.commits,
            "durable_commits": self.durable_commits,
            "operations": self.operations,
            "pipelined_commits": self.pipelined_commits,
            "apart_commits": self.apart_commits,
        }

    def close(self) -> None:
        with self._queue.cv:
            if self._queue.stopping:
                return
            self._queue.stopping = True
            self._queue.cv.notify_all()
        for t in self._threads:
            t.join(timeout=10)
        self._notifier.close()
        self._pool.close()


class _Slot:
    """A writer's connection, its ``LedgerTx`` and whether a batch is running on it."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.busy = False
        self.reset(conn)

    def reset(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self.tx = PgTx(conn)


def _run_in_savepoint(conn: psycopg.Connection[Any], tx: PgTx, op: Any, waiter: Waiter) -> Outcome:
    conn.execute("SAVEPOINT op")
    try:
        result = op(tx)
    except _RETRYABLE:
        raise
    except Exception as exc:
        if isinstance(exc, psycopg.Error) and (conn.broken or conn.closed):
            raise
        conn.execute("ROLLBACK TO SAVEPOINT op")
        conn.execute("RELEASE SAVEPOINT op")
        if isinstance(exc, psycopg.Error):
            exc = LedgerUnavailable(f"ledger write failed: {exc}")
        return waiter, False, exc
    conn.execute("RELEASE SAVEPOINT op")
    return waiter, True, result
