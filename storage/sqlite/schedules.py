"""The schedules store in ``ledger.db`` (``delivery.schedules_backend``), beside the ledger
whose rows are its occurrences, so a backup copies both at one point of history.

Its table is created on open (``CREATE ... IF NOT EXISTS``); schedules are few and each write
small: one connection under a lock, each write its own ``BEGIN IMMEDIATE`` transaction (every
process sharing the file sees it at once), like ``storage.sqlite.webhooks``.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from delivery.errors import LedgerUnavailable
from storage.schedules_sql import SCHEDULES_DDL, SqlSchedules
from storage.sqlite import files as sqlite_files
from storage.sqlite.ledger import _FILE_ERRORS, APPLICATION_ID, SCHEMA_VERSION

if TYPE_CHECKING:
    from delivery.schedules_backend import ScheduleBackend

__all__ = ["SqliteSchedules"]


class SqliteSchedules(SqlSchedules):
    """``ScheduleBackend`` on the ledger's SQLite file (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout_ms: int = 5000) -> None:
        self._file = sqlite_files.SqliteFile(
            str(path),
            name="ledger",
            application_id=APPLICATION_ID,
            schema_version=SCHEMA_VERSION,
            errors=_FILE_ERRORS,
            busy_timeout_ms=busy_timeout_ms,
        )
        self.path = self._file.path
        sqlite_files.create_private(self._file)
        conn = sqlite_files.connect(self._file, check_owner=True)
        try:
            with sqlite_files.immediate(conn, self._file):
                for statement in sqlite_files.statements(SCHEDULES_DDL):
                    if statement.strip(" \n;"):
                        conn.execute(statement)
        except BaseException:
            conn.close()
            raise
        self._conn: sqlite3.Connection | None = conn
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._conn
            if conn is None:
                raise LedgerUnavailable("the schedules store is closed")
            with sqlite_files.immediate(conn, self._file):
                yield conn

    @contextlib.contextmanager
    def _snapshot(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._conn is None:
                raise LedgerUnavailable("the schedules store is closed")
            try:
                yield self._conn
            except sqlite3.Error as exc:
                raise sqlite_files.classify(exc, self._file, "read") from exc

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


if TYPE_CHECKING:
    _conforms: type[ScheduleBackend] = SqliteSchedules
