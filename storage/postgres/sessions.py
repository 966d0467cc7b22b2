"""The PostgreSQL session backend: sessions, transcripts, tombstones and idempotency records
shared by every server on one database.

The rules are ``delivery.session_rules``'s and the rows ``storage.session_sql``'s; this module
is the pool and its transactions. Each write runs in one transaction that first takes a
transaction-scoped advisory lock on each key the rule names (its session id, the session's
turn lease, an idempotency key), so a delete, a creation, a fold and an append of one
session never interleave, whichever server runs them. Folding is one
``UPDATE ... WHERE folded_at IS NULL RETURNING``: a delivery row goes to exactly one turn.
Message ids come from a sequence, never reused. Coroutine variants run the same code on a
worker thread: the event loop never waits on the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import psycopg
import psycopg_pool

from delivery.session_backend import MessageHit, SessionStoreError
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
from storage.session_sql import SqlSessionRows, statements

T = TypeVar("T")
Conn = psycopg.Connection[Any]
_SQL = statements(PLACEHOLDER)


class PostgresSessionsUnavailable(SessionStoreError):
    """The session store's database cannot be used now."""


class PostgresRows(SqlSessionRows):
    """The shared rows, with what PostgreSQL spells its own way."""

    def supersede(self, session_id: str, ids: Sequence[int], how: str) -> int:
        return int(self.conn.execute(q.SQL_SUPERSEDE, (how, session_id, list(ids))).rowcount)

    def search(self, terms: Sequence[str], limit: int) -> list[MessageHit]:
        params = {"q": q.tsquery(list(terms)), "limit": limit}
        rows = self.conn.execute(q.SQL_SEARCH, params).fetchall()
        return [MessageHit(r[0], int(r[1]), r[2], float(r[3]), r[4]) for r in rows]

    def unfolded_by_dedupe(self, wanted: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        sids, keys = [w[0] for w in wanted], [w[1] for w in wanted]
        rows = self.conn.execute(q.SQL_UNFOLDED_BY_DEDUPE, (sids, keys)).fetchall()
        return {(str(r[0]), str(r[1])) for r in rows}


class _PostgresTx:
    """``SessionTx`` on a PostgreSQL database (see the module docstring)."""

    def __init__(self, url: str, *, pool_size: int) -> None:
        check_url(url)
        self._url = url
        self._writes = 0
        try:
            self._pool: psycopg_pool.ConnectionPool[Any] | None = open_pool(
                url, name="reveille-sessions", max_size=pool_size
            )
        except PostgresUnavailable as exc:
            raise PostgresSessionsUnavailable(str(exc)) from None

    @property
    def url(self) -> str:
        return redact(self._url)

    def stats(self) -> dict[str, int]:
        self._require_pool()
        return {"writes": self._writes, "commits": self._writes, "durable_commits": self._writes}

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def _require_pool(self) -> psycopg_pool.ConnectionPool[Any]:
        if self._pool is None:
            raise SessionStoreError(f"session store {self.url} is closed")
        return self._pool

    @contextlib.contextmanager
    def _conn(self, *, write: bool) -> Iterator[Conn]:
        pool = self._require_pool()
        try:
            with pool.connection() as conn:
                with conn.transaction():  # a write's atomicity, a read's one snapshot
                    yield conn
                if write:
                    self._writes += 1
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            err = explain(exc, self._url)
            raise PostgresSessionsUnavailable(str(err)) from exc
        except PostgresUnavailable as exc:
            raise PostgresSessionsUnavailable(str(exc)) from exc

    def write(self, locks: tuple[str, ...], op: Callable[[SessionRows], T]) -> T:
        with self._conn(write=True) as conn:
            for key in locks:
                conn.execute(q.SQL_LOCK_KEY, (key,))
            return op(PostgresRows(conn, _SQL))

    async def awrite(self, locks: tuple[str, ...], op: Callable[[SessionRows], T]) -> T:
        return await asyncio.to_thread(self.write, locks, op)

    def read(self, op: Callable[[SessionRows], T]) -> T:
        try:
            with self._conn(write=False) as conn:
                return op(PostgresRows(conn, _SQL))
        except PostgresSessionsUnavailable as exc:
            # A pooled connection the server dropped (restart, failover) is discarded by
            # the pool; a read is safe to run once more on a fresh one.
            if not isinstance(exc.__cause__, psycopg.OperationalError):
                raise
        with self._conn(write=False) as conn:
            return op(PostgresRows(conn, _SQL))

    async def aread(self, op: Callable[[SessionRows], T]) -> T:
        return await asyncio.to_thread(self.read, op)


class PostgresSessions(SessionRules):
    """``SessionBackend`` on a PostgreSQL database (see the module docstring)."""

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 8,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(_PostgresTx(url, pool_size=pool_size), clock)
