"""The schedules store in ``ledger.db`` (``delivery.schedules_backend``), beside the ledger
whose rows are its occurrences, so a backup copies both at one point of history.

Its table is created on open (``CREATE ... IF NOT EXISTS``); schedules are few and each write
small: one connection under a lock, each write its own ``BEGIN IMMEDIATE`` transaction (every
process sharing the file sees it at once): a ``LedgerSideStore``, like the webhook store.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from storage.schedules_sql import SCHEDULES_DDL, SqlSchedules
from storage.sqlite.ledger_side import LedgerSideStore

if TYPE_CHECKING:
    from delivery.schedules_backend import ScheduleBackend

__all__ = ["SqliteSchedules"]


class SqliteSchedules(LedgerSideStore, SqlSchedules):
    """``ScheduleBackend`` on the ledger's SQLite file (see the module docstring)."""

    what = "schedules store"

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout_ms: int = 5000) -> None:
        super().__init__(path, ddl=SCHEDULES_DDL, busy_timeout_ms=busy_timeout_ms)


if TYPE_CHECKING:
    _conforms: type[ScheduleBackend] = SqliteSchedules
