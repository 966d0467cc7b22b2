"""The schedules store in the PostgreSQL database (``delivery.schedules_backend``), shared by
every server on every host. The table comes from migration 17 (``storage.postgres.migrations``);
every racing write is a compare-and-set in one statement."""

from __future__ import annotations

from typing import TYPE_CHECKING

from storage.postgres.conn import PLACEHOLDER
from storage.postgres.pooled import PooledStore
from storage.schedules_sql import SqlSchedules

if TYPE_CHECKING:
    from delivery.schedules_backend import ScheduleBackend

__all__ = ["PostgresSchedules"]


class PostgresSchedules(PooledStore, SqlSchedules):
    """``ScheduleBackend`` on a PostgreSQL database (see the module docstring)."""

    mark = PLACEHOLDER
    what = "schedules store"

    def __init__(self, url: str) -> None:
        super().__init__(url, name="reveille-schedules")


if TYPE_CHECKING:
    _conforms: type[ScheduleBackend] = PostgresSchedules
