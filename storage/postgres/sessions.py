"""The PostgreSQL session backend: sessions, transcripts, tombstones and idempotency records
shared by every server on one database.

The rules are ``delivery.session_rules``'s and the rows ``storage.session_sql``'s; this module
is the pool and its transactions. Each write runs in one transaction that first takes a
transaction-scoped advisory lock on each key the rule names (its session id, the session's
turn lease, an idempotency key), so a delete, a creation, a fold and an append of one
session never interleave, whichever server runs them.

Round trips are what a turn on PostgreSQL pays for, so a write runs in pipeline mode: BEGIN
and the locks travel with the rule's first statement whose answer it reads, the statements
whose answer it does not read with the next one that it does, then COMMIT. That first trip
(or, for a rule that reads nothing, a trip of their own before COMMIT) is also how a
connection the server dropped is found out (a restart, a failover): nothing ran, so the
pool checks its idle connections and the write runs once more; the pool hands connections
out without a checking trip of its own. A read is its statements in autocommit, one trip each: under
READ COMMITTED a transaction around them would give them no common snapshot, only a BEGIN
and a COMMIT to wait for. Folding is one
``UPDATE ... WHERE folded_at IS NULL RETURNING``: a delivery row goes to exactly one turn.
Message ids come from a sequence, never reused. A coroutine's read runs the same code on a
worker thread; its write is queued to the writer threads, which commit the writes waiting
together as one transaction (``storage.postgres.session_batches``): the event loop never
waits on the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import psycopg
import psycopg_pool

from delivery.session_backend import MessageHit, NewMessage, NewSession, SessionStoreError
from delivery.session_rows import SessionRows
from delivery.session_rules import SessionRules
from storage.postgres import sql as q
from storage.postgres.conn import (
    PLACEHOLDER,
    PostgresUnavailable,
    check_url,
    explain,
    open_pool,
    redact,
)
from storage.postgres.held_inserts import MAX_ROWS, HeldInserts
from storage.postgres.session_batches import SessionBatches, SessionReads
from storage.postgres.tx import rollback_quietly
from storage.session_sql import SqlSessionRows, message_values, session_values, statements

T = TypeVar("T")
Conn = psycopg.Connection[Any]
_SQL = statements(PLACEHOLDER)


class PostgresSessionsUnavailable(SessionStoreError):
    """The session store's database cannot be used now."""


# A read sent ahead: its statement, its parameters and the cursor its answer is on.
Ahead = tuple[str, tuple[Any, ...], psycopg.Cursor[Any]]


class PostgresRows(SqlSessionRows):
    """The shared rows, with what PostgreSQL spells its own way; in a write, on a connection
    in pipeline mode (``pipeline``). ``answered``: whether an answer has come back from the
    server yet (the write's first trip, which BEGIN and the locks travel with)."""

    def __init__(
        self,
        conn: Conn,
        sql: Any,
        pipeline: psycopg.Pipeline | None = None,
        ahead: Ahead | None = None,
        after: PostgresRows | None = None,
    ) -> None:
        # New sessions and messages not sent yet (``storage.postgres.held_inserts``): shared
        # with the operation before this one in a batch (``after``), so a batch's inserts
        # are one statement; anything else that uses the connection sends them first.
        self._held: HeldInserts = after._held if after is not None else HeldInserts(conn)
        super().__init__(conn, sql)
        self._pipeline = pipeline
        # The answer to this operation's first read, already sent in a batch's pipeline
        # (``first_read``): used when that read is the first one it makes.
        self._ahead = ahead
        self.answered = False

    @property
    def conn(self) -> Conn:
        if self._held:
            self._held.send()  # the statements reach the server in the order they were made
        return self._conn

    @conn.setter
    def conn(self, conn: Conn) -> None:
        self._conn = conn

    def flush(self) -> None:
        """Sends what is held back: the write's rules have returned."""
        self._held.send()

    def _sent_ahead(self, query: str, params: Sequence[Any]) -> psycopg.Cursor[Any] | None:
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == query and ahead[1] == tuple(params):
            return ahead[2]
        return None

    def _one(self, query: str, params: Sequence[Any]) -> Any:
        cur = self._sent_ahead(query, params)
        row = cur.fetchone() if cur is not None else super()._one(query, params)
        self.answered = True
        return row

    def _all(self, query: str, params: Sequence[Any] = ()) -> list[Any]:
        cur = self._sent_ahead(query, params)
        rows = list(cur.fetchall()) if cur is not None else super()._all(query, params)
        self.answered = True
        return rows

    def _count(self, query: str, params: Sequence[Any]) -> int:
        cur = self.conn.execute(query, tuple(params))
        if self._pipeline is not None:
            self._pipeline.sync()  # a row count arrives with the statement's answer
        self.answered = True
        return int(cur.rowcount)

    def insert_session(self, session_id: str, new: NewSession, now: float) -> None:
        # Nobody reads its answer (an id that exists is no error): held, to travel with the
        # session's messages.
        self._held.session(session_values(session_id, new, now))
        self.created(session_id, now)

    def insert_messages(self, session_id: str, messages: Sequence[NewMessage], now: float) -> None:
        # Nobody reads these rows back (a dedupe key that names one already is no error):
        # held, so a turn's (a batch's) new sessions and messages are one statement, which
        # in a write's pipeline travels with the next statement whose answer is read.
        for start in range(0, len(messages), MAX_ROWS):
            chunk = messages[start : start + MAX_ROWS]
            values = [v for m in chunk for v in message_values(session_id, m, now)]
            self._held.messages(len(chunk), values)

    def supersede(self, session_id: str, ids: Sequence[int], how: str) -> int:
        return self._count(q.SQL_SUPERSEDE, (how, session_id, list(ids)))

    def search(self, terms: Sequence[str], limit: int) -> list[MessageHit]:
        params = {"q": q.tsquery(list(terms)), "limit": limit}
        rows = self.conn.execute(q.SQL_SEARCH, params).fetchall()
        return [MessageHit(r[0], int(r[1]), r[2], float(r[3]), r[4]) for r in rows]

    def unfolded_by_dedupe(self, wanted: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        sids, keys = [w[0] for w in wanted], [w[1] for w in wanted]
        rows = self._all(q.SQL_UNFOLDED_BY_DEDUPE, (sids, keys))
        return {(str(r[0]), str(r[1])) for r in rows}


class _FirstRead(BaseException):
    """Ends an operation's dry run at its first read (``statement``; None: it needs
    something other than a plain read first). A BaseException, so that no ``except
    Exception`` of the operation takes it for a failure of its own."""

    def __init__(self, statement: tuple[str, tuple[Any, ...]] | None) -> None:
        super().__init__()
        self.statement = statement


class _NoConnection:
    """The connection of a dry run: any direct use of it ends the run."""

    def __getattr__(self, name: str) -> Any:
        raise _FirstRead(None)


class _FindFirstRead(PostgresRows):
    def __init__(self) -> None:
        super().__init__(_NoConnection(), _SQL)  # type: ignore[arg-type]

    # A write that comes first: no read of the operation can be sent ahead of it.
    def insert_session(self, session_id: str, new: NewSession, now: float) -> None:
        raise _FirstRead(None)

    def insert_messages(self, session_id: str, messages: Sequence[NewMessage], now: float) -> None:
        raise _FirstRead(None)

    def _one(self, query: str, params: Sequence[Any]) -> Any:
        raise _FirstRead((query, tuple(params)))

    def _all(self, query: str, params: Sequence[Any] = ()) -> list[Any]:
        raise _FirstRead((query, tuple(params)))

    def _count(self, query: str, params: Sequence[Any]) -> int:
        raise _FirstRead(None)


def first_read(op: Callable[[SessionRows], Any]) -> tuple[str, tuple[Any, ...]] | None:
    """The statement a read operation starts with, found by running it against rows that
    stop it there (a read has no effects to undo); None when it starts otherwise."""
    try:
        op(_FindFirstRead())
    except _FirstRead as first:
        return first.statement
    except Exception:
        return None  # its real run says what went wrong
    return None


class _Dropped(Exception):
    """A write's first trip found its connection dropped by the server: nothing ran."""


class _PostgresTx:
    """``SessionTx`` on a PostgreSQL database (see the module docstring)."""

    def __init__(self, url: str, *, pool_size: int, writers: int, readers: int) -> None:
        check_url(url)
        self._url = url
        self._writes = 0
        try:
            self._pool: psycopg_pool.ConnectionPool[Any] | None = open_pool(
                url, name="reveille-sessions", max_size=pool_size, check=False
            )
        except PostgresUnavailable as exc:
            raise PostgresSessionsUnavailable(str(exc)) from None
        self._batches = SessionBatches(
            self._require_pool,
            lambda conn, pipeline, ahead, after: PostgresRows(conn, _SQL, pipeline, ahead, after),
            first_read,
            self.write,
            closed=self._closed,
            lost=self._unavailable,
            writers=writers,
        )
        self._reads = SessionReads(
            self._require_pool,
            lambda conn, ahead: PostgresRows(conn, _SQL, ahead=ahead),
            first_read,
            self.read,
            self._closed,
            readers=readers,
        )

    @property
    def url(self) -> str:
        return redact(self._url)

    def stats(self) -> dict[str, int]:
        self._require_pool()
        writes = self._writes + self._batches.batched
        commits = self._writes + self._batches.batches
        return {"writes": writes, "commits": commits, "durable_commits": commits}

    def close(self) -> None:
        self._reads.close()
        self._batches.close()  # what coroutines queued is written first
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def _closed(self) -> SessionStoreError:
        return SessionStoreError(f"session store {self.url} is closed")

    def _unavailable(self, exc: Exception) -> PostgresSessionsUnavailable:
        return PostgresSessionsUnavailable(str(explain(exc, self._url)))

    def _require_pool(self) -> psycopg_pool.ConnectionPool[Any]:
        if self._pool is None:
            raise self._closed()
        return self._pool

    @contextlib.contextmanager
    def _explained(self) -> Iterator[None]:
        """The driver's and the pool's failures, as this store's."""
        try:
            yield
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            err = explain(exc, self._url)
            raise PostgresSessionsUnavailable(str(err)) from exc
        except PostgresUnavailable as exc:
            raise PostgresSessionsUnavailable(str(exc)) from exc

    def _write_once(self, locks: tuple[str, ...], op: Callable[[SessionRows], T]) -> T:
        pool = self._require_pool()
        with pool.connection() as conn:
            try:
                with conn.pipeline() as pipeline:
                    # BEGIN and the locks travel with the rule's first statement whose answer
                    # it reads; a rule that reads none waits for them before COMMIT. Until an
                    # answer has come back nothing ran, so a dropped connection is found out
                    # there, safe to run the write again.
                    rows = PostgresRows(conn, _SQL, pipeline)
                    try:
                        conn.execute("BEGIN")
                        if len(locks) == 1:
                            conn.execute(q.SQL_LOCK_KEY, locks)
                        elif locks:  # in the one order every writer takes them in
                            conn.execute(q.SQL_LOCK_KEYS, (list(locks),))
                        result = op(rows)
                        rows.flush()
                        if not rows.answered:
                            pipeline.sync()
                    except psycopg.OperationalError as exc:
                        if rows.answered:
                            raise
                        raise _Dropped from exc
                    conn.execute("COMMIT")
            except BaseException:
                rollback_quietly(conn)
                raise
        self._writes += 1
        return result

    def write(self, locks: tuple[str, ...], op: Callable[[SessionRows], T]) -> T:
        with self._explained():
            try:
                return self._write_once(locks, op)
            except _Dropped:
                # Nothing ran on the dropped connection. Its idle siblings were most likely
                # dropped with it (a restart): the pool checks them all, then the write
                # runs once more, on a live connection.
                self._require_pool().check()
            try:
                return self._write_once(locks, op)
            except _Dropped as dropped:
                assert dropped.__cause__ is not None
                raise dropped.__cause__ from None

    def awrite(self, locks: tuple[str, ...], op: Callable[[SessionRows], T]) -> asyncio.Future[T]:
        # Queued for the writer threads: the writes waiting together commit together.
        return self._batches.submit(locks, op)

    def _read_once(self, op: Callable[[SessionRows], T]) -> T:
        with self._explained(), self._require_pool().connection() as conn:
            return op(PostgresRows(conn, _SQL))

    def read(self, op: Callable[[SessionRows], T]) -> T:
        try:
            return self._read_once(op)
        except PostgresSessionsUnavailable as exc:
            # A pooled connection the server dropped (restart, failover) is discarded by
            # the pool; a read is safe to run once more on a live one.
            if not isinstance(exc.__cause__, psycopg.OperationalError):
                raise
        self._require_pool().check()  # its idle siblings were most likely dropped with it
        return self._read_once(op)

    def aread(self, op: Callable[[SessionRows], T]) -> asyncio.Future[T]:
        # Queued for the reader threads: one hand-off and one wake-up per batch of reads.
        return self._reads.submit(op)


class PostgresSessions(SessionRules):
    """``SessionBackend`` on a PostgreSQL database (see the module docstring)."""

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 8,
        writers: int = 2,
        readers: int = 2,
        clock: Callable[[], float] = time.time,
    ) -> None:
        tx = _PostgresTx(url, pool_size=pool_size, writers=writers, readers=readers)
        super().__init__(tx, clock)
