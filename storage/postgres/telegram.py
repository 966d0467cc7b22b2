"""The Telegram state in the PostgreSQL database (``delivery.telegram_backend`` over
``storage.telegram_sql``), shared by every server on every host: one of them polls (the
lease), any of them takes a webhook update, and each update is claimed by one.

The tables come from the migration "telegram: the adapter's state in the store"
(``storage.postgres.migrations``); the polling lease is a row of the ledger's ``leases``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import psycopg
import psycopg_pool

from storage.postgres.conn import PostgresUnavailable, check_url, explain, open_pool
from storage.postgres.dialect import PLACEHOLDER
from storage.telegram_sql import SqlTelegram

if TYPE_CHECKING:
    from delivery.telegram_backend import TelegramBackend

__all__ = ["PostgresTelegram"]


class PostgresTelegram(SqlTelegram):
    """``TelegramBackend`` on a PostgreSQL database (see the module docstring)."""

    def __init__(self, url: str) -> None:
        super().__init__(PLACEHOLDER)
        check_url(url)
        self._url = url
        self._pool: psycopg_pool.ConnectionPool[Any] | None = open_pool(
            url, name="reveille-telegram", max_size=2
        )

    @contextlib.contextmanager
    def _tx(self) -> Iterator[psycopg.Connection[Any]]:
        if self._pool is None:
            raise PostgresUnavailable("the Telegram state is closed")
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
    _conforms: type[TelegramBackend] = PostgresTelegram
