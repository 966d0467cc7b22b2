"""A small store of its own tables in the PostgreSQL database, over a pool of its own: the
webhook store, the inbound-event store. ``_tx`` is one transaction (an error is explained
in the store's terms: ``storage.postgres.conn.explain``); ``close`` closes the pool."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg
import psycopg_pool

from storage.postgres.conn import PostgresUnavailable, check_url, explain, open_pool

__all__ = ["PooledStore"]


class PooledStore:
    what = "store"  # names the store in errors ("the webhook store is closed")

    def __init__(self, url: str, *, name: str, max_size: int = 2) -> None:
        check_url(url)
        self._url = url
        self._pool: psycopg_pool.ConnectionPool[Any] | None = open_pool(
            url, name=name, max_size=max_size
        )

    @contextlib.contextmanager
    def _tx(self) -> Iterator[psycopg.Connection[Any]]:
        if self._pool is None:
            raise PostgresUnavailable(f"the {self.what} is closed")
        try:
            with self._pool.connection() as conn, conn.transaction():
                yield conn
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            raise explain(exc, self._url) from exc

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
