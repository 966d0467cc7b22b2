"""The inbound-event store in ``ledger.db`` (``delivery.inbound_backend``), beside the ledger.

Its tables (``storage.hooks_sql.HOOK_DDL``) are additive: created if missing whenever this
store opens the file, which it opens with the ledger's marks, like the webhook store. The
file is created private (0600): the hooks' secrets are in it. Inbound events are few and each
write is small: one connection under a lock, each write its own ``BEGIN IMMEDIATE``
transaction, so every process sharing the file sees a stored event at once.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from delivery.errors import LedgerUnavailable
from storage.hooks_sql import HOOK_DDL, SqlHooks
from storage.sqlite import files as sqlite_files
from storage.sqlite.ledger import _FILE_ERRORS, _SCHEMA, APPLICATION_ID, SCHEMA_VERSION

if TYPE_CHECKING:
    from delivery.inbound_backend import HookBackend

__all__ = ["SqliteHooks"]


class SqliteHooks(SqlHooks):
    """``HookBackend`` on the ledger's SQLite file (see the module docstring)."""

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
            sqlite_files.stamp_schema(conn, self._file, _SCHEMA + HOOK_DDL)
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
                raise LedgerUnavailable("the inbound-event store is closed")
            with sqlite_files.immediate(conn, self._file):
                yield conn

    @contextlib.contextmanager
    def _snapshot(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._conn is None:
                raise LedgerUnavailable("the inbound-event store is closed")
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
    _conforms: type[HookBackend] = SqliteHooks
