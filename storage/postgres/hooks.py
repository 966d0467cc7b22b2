"""The inbound-event store in the PostgreSQL database (``delivery.inbound_backend``), shared
by every server on every host: an event posted to any of them is stored once, under the
``(hook, webhook_id)`` key. The tables come from the migration "inbound events"
(``storage.postgres.migrations``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import psycopg
import psycopg_pool

from storage.hooks_sql import SqlHooks
from storage.postgres.conn import PostgresUnavailable, check_url, explain, open_pool

if TYPE_CHECKING:
    from delivery.inbound_backend import HookBackend

__all__ = ["PostgresHooks"]


class PostgresHooks(SqlHooks):
    """``HookBackend`` on a PostgreSQL database (see the module docstring)."""

    mark = "%s"

    def __init__(self, url: str) -> None:
        check_url(url)
        self._url = url
        self._pool: psycopg_pool.ConnectionPool[Any] | None = open_pool(
            url, name="reveille-hooks", max_size=2
        )

    @contextlib.contextmanager
    def _tx(self) -> Iterator[psycopg.Connection[Any]]:
        if self._pool is None:
            raise PostgresUnavailable("the inbound-event store is closed")
        try:
            with self._pool.connection() as conn, conn.transaction():
                yield conn
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            raise explain(exc, self._url) from exc

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()


if TYPE_CHECKING:
    _conforms: type[HookBackend] = PostgresHooks
