"""The ``LedgerTx`` of a PostgreSQL writer, and its batches sent in one round trip.

``PgTx`` runs each primitive as one prepared statement and waits for its result: a batch of
n operations costs n + 2 round trips (BEGIN, one statement each, COMMIT). Nearly every
ledger write is one compare-and-set (or insert) whose row count is its answer, so
``run_pipelined`` runs a batch in two instead: it asks each operation for its first
statement without running anything (the operation stops at its first primitive), sends
BEGIN and all of those statements in one pipeline, hands each operation its statement's
result, and commits. Statements go in the order the operations were submitted, so when
every operation stops after its first statement, the outcome is exactly what running
them one by one gives. An operation that wants a second statement (a compare-and-set
that missed and looks at the row, say) makes the batch roll back and run the ordinary
way: ``None`` tells the caller so. Audit entries after the first statement are the one
exception: they are written together before the COMMIT. ``update_many`` over distinct rows
(a re-offer pass marking hundreds of due timers) sends one statement per shape of update
(``storage.postgres.cas_batch``), not one per row.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

import psycopg

from delivery.backend import COLUMNS, JSON_COLUMNS, Update, check_columns
from delivery.errors import DuplicateDeliveryError
from delivery.peers import ServerRecord
from storage.postgres import sql as sql
from storage.postgres.cas_batch import BatchCompiler, groups
from storage.postgres.conn import PLACEHOLDER
from storage.sql import Statement, UpdateCompiler, decode_columns, dump_json
from storage.waiters import Outcome, Waiter

# From this many compare-and-sets ``update_many`` sends one statement per shape of them
# (``storage.postgres.cas_batch``); fewer go one statement each.
_BATCH_MIN = 4


class PgTx:
    """The ``LedgerTx`` of the operations of one batch, on a writer's connection."""

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        *,
        locked: Iterable[str] = (),
        busy: Iterable[str] = (),
    ) -> None:
        self._conn = conn
        self._cur = conn.cursor()
        # Rows this transaction already holds locked (``PostgresBackend.write_due`` read
        # them ``FOR UPDATE``, ``write_locked`` locked them by id): ``lock_free`` answers
        # for them without asking again.
        self._locked = frozenset(locked)
        # Rows it asked for and found locked by another transaction (``write_locked``):
        # not free now either, and asking again would cost a round trip.
        self._busy = frozenset(busy)
        self.dirty = False  # changed something since the last ``mark``
        self._select_sql: dict[tuple[str, ...], str] = {}
        self._insert_sql: dict[tuple[str, ...], str] = {}
        self._updates = UpdateCompiler(PLACEHOLDER)
        self._batches = BatchCompiler()

    def _exec(self, query: str, params: Iterable[Any] = ()) -> psycopg.Cursor[Any]:
        return self._cur.execute(query, list(params), prepare=True)

    # Each primitive below is a statement builder and a reading of its result, so that a
    # pipelined batch builds and reads exactly what a primitive run on its own would.

    def get(self, row_id: str, columns: tuple[str, ...] | None = None) -> dict[str, Any] | None:
        cols = columns or COLUMNS
        query = self._select_sql.get(cols)
        if query is None:
            check_columns(cols)
            query = self._select_sql[cols] = (
                f"SELECT {', '.join(cols)} FROM deliveries WHERE id = %s"
            )
        found = self._exec(query, (row_id,)).fetchone()
        return None if found is None else decode_columns(found, cols)

    def insert_statement(self, row: dict[str, Any]) -> Statement:
        cols = tuple(row)
        query = self._insert_sql.get(cols)
        if query is None:
            check_columns(cols)
            query = self._insert_sql[cols] = (
                f"INSERT INTO deliveries ({', '.join(cols)}) "
                f"VALUES ({', '.join(['%s'] * len(cols))}) ON CONFLICT (id) DO NOTHING"
            )
        params = [
            dump_json(row[c]) if c in JSON_COLUMNS and row[c] is not None else row[c] for c in cols
        ]
        return query, params

    def inserted(self, row: dict[str, Any], rowcount: int) -> None:
        if rowcount != 1:
            raise DuplicateDeliveryError(f"a ledger row with id {row['id']!r} exists")
        self.dirty = True

    def insert(self, row: dict[str, Any]) -> None:
        self.inserted(row, self._exec(*self.insert_statement(row)).rowcount)

    def update_statement(
        self, row_id: str, expect: dict[str, Any], changes: dict[str, Any]
    ) -> Statement:
        return self._updates.statement(row_id, expect, changes)

    def updated(self, rowcount: int) -> bool:
        changed = rowcount == 1
        self.dirty = self.dirty or changed
        return changed

    def update(self, row_id: str, expect: dict[str, Any], changes: dict[str, Any]) -> bool:
        return self.updated(self._exec(*self.update_statement(row_id, expect, changes)).rowcount)

    def update_many(self, updates: list[Update]) -> list[bool]:
        ids = {row_id for row_id, _e, _c in updates}
        if len(updates) >= _BATCH_MIN and len(ids) == len(updates):
            statements = self._by_shape(updates)
            if statements is not None:
                return self._update_batched(updates, statements)
        # One pipeline: every compare-and-set goes out before the first answer is read.
        with self._conn.pipeline():
            cursors = [
                self._conn.cursor().execute(*self.update_statement(*one), prepare=True)
                for one in updates
            ]
        return [self.updated(cur.rowcount) for cur in cursors]

    def batch_statement(self, updates: list[Update]) -> Statement | None:
        """One statement for updates of one shape, each of a row of its own (None: they
        must go one by one)."""
        return self._batches.statement(updates)

    def _by_shape(self, updates: list[Update]) -> list[tuple[list[int], Statement]] | None:
        found = []
        for positions in groups(updates).values():
            statement = self._batches.statement([updates[i] for i in positions])
            if statement is None:
                return None
            found.append((positions, statement))
        return found

    def _update_batched(
        self, updates: list[Update], statements: list[tuple[list[int], Statement]]
    ) -> list[bool]:
        """Each row its own compare-and-set, a statement per shape (``cas_batch``), all in
        one pipeline. The rows are distinct, so no update can see another's effect and the
        order they run in cannot change any answer."""
        with self._conn.pipeline():
            sent = [
                (positions, self._conn.cursor().execute(*statement, prepare=True))
                for positions, statement in statements
            ]
        answers = [False] * len(updates)
        for positions, cur in sent:
            changed = {found[0] for found in cur.fetchall()}
            for i in positions:
                answers[i] = self.updated(1 if updates[i][0] in changed else 0)
        return answers

    def adopt_waiting(self, holder: str, identity: str, now: float, limit: int) -> int:
        args = (holder, now, int(limit), identity, now)
        adopted: int = self._exec(sql.LEDGER_ADOPT_WAITING, args).rowcount
        self.dirty = self.dirty or adopted > 0
        return adopted

    def lock_free(self, row_ids: list[str]) -> set[str]:
        free = {row_id for row_id in row_ids if row_id in self._locked}
        ask = [r for r in row_ids if r not in self._locked and r not in self._busy]
        if ask:
            free.update(r[0] for r in self._exec(sql.LEDGER_LOCK_SKIP_LOCKED, (ask,)).fetchall())
        return free

    def audit(self, row_id: str, action: str, detail: str, at: float) -> None:
        self._exec(sql.LEDGER_INSERT_AUDIT, (row_id, at, action, detail))
        self.dirty = True

    def audit_many(self, entries: list[tuple[str, str, str, float]]) -> None:
        """Audit entries ``(row_id, action, detail, at)``, in order, in one round trip."""
        self._cur.executemany(
            sql.LEDGER_INSERT_AUDIT,
            [(row_id, at, action, detail) for row_id, action, detail, at in entries],
        )
        self.dirty = True

    def put_server(self, record: ServerRecord) -> None:
        self._exec(
            sql.SERVERS_PUT,
            (record.identity, record.label, record.started_at, record.heartbeat_at),
        )
        self.dirty = True

    def delete_server(self, identity: str) -> bool:
        gone = self._exec(sql.SERVERS_DELETE, (identity,)).rowcount == 1
        self.dirty = self.dirty or gone
        return gone


# --------------------------------------------------------------------------- pipelined


class _Stop(BaseException):
    """Ends an operation's run early. A BaseException, so that no ``except Exception`` in
    an operation can take it for a failure of its own."""


class _OneStatementOnly:
    """The primitives a pipelined batch never sends ahead: each stops the operation. An
    operation that starts by reading the row (a release, a drop) goes on to write it, so
    sending its read ahead would only cost a rollback."""

    def get(self, row_id: str, columns: tuple[str, ...] | None = None) -> dict[str, Any] | None:
        raise _Stop

    def update_many(self, updates: list[Update]) -> list[bool]:
        raise _Stop

    def adopt_waiting(self, holder: str, identity: str, now: float, limit: int) -> int:
        raise _Stop

    def lock_free(self, row_ids: list[str]) -> set[str]:
        raise _Stop

    def audit(self, row_id: str, action: str, detail: str, at: float) -> None:
        raise _Stop

    def put_server(self, record: ServerRecord) -> None:
        raise _Stop

    def delete_server(self, identity: str) -> bool:
        raise _Stop


class _FirstStatement(_OneStatementOnly):
    """A ``LedgerTx`` that records an operation's first primitive instead of running it."""

    def __init__(self, tx: PgTx) -> None:
        self._tx = tx
        self.kind: str | None = None  # None: the first primitive is one not sent ahead
        self.statement: Statement | None = None  # an insert's; an update's is built later
        self.arg: Any = None
        self.row_id = ""
        self.update_args: Update | None = None  # an update's, to go with others of its shape

    def insert(self, row: dict[str, Any]) -> None:
        self.kind, self.arg, self.row_id = "insert", row, row.get("id", "")
        self.statement = self._tx.insert_statement(row)
        raise _Stop

    def update(self, row_id: str, expect: dict[str, Any], changes: dict[str, Any]) -> bool:
        # Its own statement is built only if it goes alone (``_statements``): most go with
        # others of their shape, and building one per row cost a tenth of a burst's writer.
        self.kind, self.row_id = "update", row_id
        self.update_args = (row_id, expect, changes)
        raise _Stop


class _Answered(_OneStatementOnly):
    """A ``LedgerTx`` that answers an operation's first primitive from its pipelined
    result, and stops the operation if it asks for anything more, but an audit entry.

    An audit entry after the first statement (a timer's schedule: its insert, then its
    entry) is kept in ``audits`` and written with the batch's others before its COMMIT:
    nothing in a batch reads the audit log, so writing the entries after every operation's
    first statement gives what running them one by one gives."""

    def __init__(
        self,
        tx: PgTx,
        first: _FirstStatement,
        rowcount: int,
        audits: list[tuple[str, str, str, float]],
    ) -> None:
        self._tx = tx
        self._first: _FirstStatement | None = first
        self._rowcount = rowcount
        self._audits = audits

    def _take(self, kind: str) -> _FirstStatement:
        first, self._first = self._first, None
        if first is None or first.kind != kind:
            raise _Stop  # a second statement: this batch runs the ordinary way
        return first

    def insert(self, row: dict[str, Any]) -> None:
        first = self._take("insert")
        self._tx.inserted(first.arg, self._rowcount)

    def update(self, row_id: str, expect: dict[str, Any], changes: dict[str, Any]) -> bool:
        self._take("update")
        return self._tx.updated(self._rowcount)

    def audit(self, row_id: str, action: str, detail: str, at: float) -> None:
        if self._first is not None:
            raise _Stop  # an audit before the statement sent ahead: the ordinary way
        self._audits.append((row_id, action, detail, at))
        self._tx.dirty = True


def run_pipelined(
    conn: psycopg.Connection[Any], tx: PgTx, live: list[tuple[Any, Waiter]], durable: bool
) -> list[Outcome] | None:
    """Run and commit the batch in two round trips (see the module docstring), or return
    None, with nothing written, when it must run the ordinary way."""
    firsts: list[_FirstStatement] = []
    for op, _waiter in live:
        first = _FirstStatement(tx)
        try:
            op(first)
        except _Stop:
            pass
        except Exception:
            return None  # it fails before its first statement: the ordinary way says how
        if first.kind is None:
            return None  # no statement, or one this path does not send ahead
        firsts.append(first)
    try:
        statements = _statements(tx, firsts)
    except Exception:
        return None  # a statement that cannot be built: the ordinary way says why
    try:
        with conn.pipeline():
            conn.execute("BEGIN")
            if not durable:
                conn.execute("SET LOCAL synchronous_commit = off")
            sent = [
                (positions, conn.cursor().execute(query, params, prepare=True), grouped)
                for positions, (query, params), grouped in statements
            ]
        rowcounts = [0] * len(firsts)
        for positions, cur, grouped in sent:
            if grouped:  # one statement of several updates: each row it returned changed
                changed = {found[0] for found in cur.fetchall()}
                for i in positions:
                    rowcounts[i] = 1 if firsts[i].row_id in changed else 0
            else:
                rowcounts[positions[0]] = cur.rowcount
        audits: list[tuple[str, str, str, float]] = []
        answered = [_Answered(tx, f, n, audits) for f, n in zip(firsts, rowcounts, strict=True)]
        try:
            outcomes = run_each(conn, tx, live, views=answered)
        except _Stop:
            conn.execute("ROLLBACK")
            return None
        if outcomes is not None:
            if audits:
                tx.audit_many(audits)
            conn.execute("COMMIT")
    except BaseException:
        rollback_quietly(conn)
        raise
    return outcomes


def _statements(tx: PgTx, firsts: list[_FirstStatement]) -> list[tuple[list[int], Statement, bool]]:
    """The first statements of a batch, to send in its pipeline: (the positions each
    answers for, the statement, whether it is one statement of several updates). Built
    before anything is sent, so that one which cannot be built sends nothing.

    When every statement touches a row of its own (the claims and acknowledgements of a
    burst of timers firing, each a compare-and-set of the same shape), no statement can see
    another's effect, so their order cannot change an answer: the updates of one shape go
    as one statement (``storage.postgres.cas_batch``). Otherwise each goes as it is, in the
    order submitted."""
    found: list[tuple[list[int], Statement, bool]] = []
    ids = {first.row_id for first in firsts}
    by_shape: dict[tuple[Any, ...], list[int]] = {}
    if len(firsts) >= _BATCH_MIN and len(ids) == len(firsts) and "" not in ids:
        updates = {i: f.update_args for i, f in enumerate(firsts) if f.update_args is not None}
        by_shape = groups(updates.values(), positions=list(updates))
    grouped: set[int] = set()
    for positions in by_shape.values():
        if len(positions) > 1:
            batch = [firsts[i].update_args for i in positions]
            statement = tx.batch_statement([u for u in batch if u is not None])
            if statement is not None:
                found.append((positions, statement, True))
                grouped.update(positions)
    for i, first in enumerate(firsts):
        if i not in grouped:
            if first.update_args is not None:
                found.append(([i], tx.update_statement(*first.update_args), False))
            else:
                assert first.statement is not None
                found.append(([i], first.statement, False))
    return found


def run_each(
    conn: psycopg.Connection[Any],
    tx: PgTx,
    live: list[tuple[Any, Waiter]],
    *,
    views: list[Any] | None = None,
) -> list[Outcome] | None:
    """Run each operation in order, in the open transaction, on ``tx`` (or on its view in
    ``views``). An operation that raises without having written fails alone; one that
    raised after writing rolls the transaction back, and None says to run them again, one
    savepoint each."""
    outcomes: list[Outcome] = []
    for i, (op, waiter) in enumerate(live):
        tx.dirty = False
        try:
            result = op(tx if views is None else views[i])
        except psycopg.Error:
            raise
        except Exception as exc:
            if tx.dirty:
                conn.execute("ROLLBACK")
                return None
            outcomes.append((waiter, False, exc))
        else:
            outcomes.append((waiter, True, result))
    return outcomes


def rollback_quietly(conn: psycopg.Connection[Any]) -> None:
    """End whatever transaction a failure left open, when the connection still can."""
    idle = psycopg.pq.TransactionStatus.IDLE
    if not (conn.broken or conn.closed) and conn.info.transaction_status != idle:
        with contextlib.suppress(psycopg.Error):
            conn.execute("ROLLBACK")
