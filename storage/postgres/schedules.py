"""The schedules store in the PostgreSQL database (``delivery.schedules_backend``), shared by
every server on every host. The table comes from migration 16 (``storage.postgres.migrations``);
every racing write is a compare-and-set in one statement."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import psycopg
import psycopg_pool

from storage.postgres.conn import PostgresUnavailable, check_url, explain, open_pool
from storage.schedules_sql import SqlSchedules

if TYPE_CHECKING:
    from delivery.schedules_backend import ScheduleBackend

__all__ = ["PostgresSchedules"]


class PostgresSchedules(SqlSchedules):
    """``ScheduleBackend`` on a PostgreSQL database (see the module docstring)."""

    mark = "%s"

    def __init__(self, url: str) -> None:
        check_url(url)
        self._url = url
        self._pool: psycopg_pool.ConnectionPool[Any] | None = open_pool(
            url, name="reveille-schedules", max_size=2
        )

    @contextlib.contextmanager
    def _tx(self) -> Iterator[psycopg.Connection[Any]]:
        if self._pool is None:
            raise PostgresUnavailable("the schedules store is closed")
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
    _conforms: type[ScheduleBackend] = PostgresSchedules
