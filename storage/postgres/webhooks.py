"""The webhook store in the PostgreSQL database (``delivery.webhooks_backend``), shared by
every server on every host: whichever claims a due row sends it.

The tables come from migration 7 (``storage.postgres.migrations``). A claim locks the rows
it picks with ``FOR UPDATE SKIP LOCKED``, so servers claiming at once take different rows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import psycopg
import psycopg_pool

from storage.postgres.conn import PostgresUnavailable, check_url, explain, open_pool
from storage.postgres.dialect import PLACEHOLDER
from storage.webhooks_sql import SqlWebhooks

if TYPE_CHECKING:
    from delivery.webhooks_backend import WebhookBackend

__all__ = ["PostgresWebhooks"]


class PostgresWebhooks(SqlWebhooks):
    """``WebhookBackend`` on a PostgreSQL database (see the module docstring)."""

    def __init__(self, url: str) -> None:
        super().__init__(PLACEHOLDER, lock_clause=" FOR UPDATE SKIP LOCKED")
        check_url(url)
        self._url = url
        self._pool: psycopg_pool.ConnectionPool[Any] | None = open_pool(
            url, name="reveille-webhooks", max_size=2
        )

    @contextlib.contextmanager
    def _tx(self) -> Iterator[psycopg.Connection[Any]]:
        if self._pool is None:
            raise PostgresUnavailable("the webhook store is closed")
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
    _conforms: type[WebhookBackend] = PostgresWebhooks
