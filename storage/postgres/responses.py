"""The Responses API's tables in the PostgreSQL database (migration 6), shared by every
server on every host.

The SQL is ``storage.responses_sql``'s (a selected row is locked ``FOR UPDATE`` before events
are numbered). The servers poke each other with ``LISTEN/NOTIFY`` on a channel of their own,
through the ledger's ``PostgresNotifier``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import psycopg
import psycopg_pool

from delivery.responses_backend import ResponsesBackend
from storage.postgres.conn import PLACEHOLDER, PostgresUnavailable, check_url, explain, open_pool
from storage.postgres.notifier import PostgresNotifier
from storage.responses_sql import ResponsesSql

__all__ = ["PostgresResponses"]

Conn = psycopg.Connection[Any]


class PostgresResponses(ResponsesSql):
    """``ResponsesBackend`` on a PostgreSQL database (see the module docstring)."""

    def __init__(self, url: str, *, schema: str) -> None:
        check_url(url)
        self._url = url
        self._pool: psycopg_pool.ConnectionPool[Any] | None = open_pool(
            url, name="reveille-responses", max_size=4
        )
        notifier = PostgresNotifier(url, f"reveille_responses_{schema}"[:63], self._pool)
        self._pg_notifier = notifier
        super().__init__(
            PLACEHOLDER, self._transaction, lock=" FOR UPDATE", notifier=notifier, close=self._shut
        )

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Conn]:
        if self._pool is None:
            raise PostgresUnavailable("the responses store is closed")
        try:
            with self._pool.connection() as conn, conn.transaction():
                yield conn
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            raise explain(exc, self._url) from exc

    def _shut(self) -> None:
        self._pg_notifier.close()
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()


if TYPE_CHECKING:
    _conforms: type[ResponsesBackend] = PostgresResponses
