"""The webhook store in ``ledger.db`` (``delivery.webhooks_backend``), beside the ledger.

The tables belong to the ledger's schema (version 2, ``storage.sqlite.webhooks_sql``) and the
file is opened with the ledger's marks, so a version-1 ledger gains them whichever of the two
opens it first. Webhooks are few and each write is small: one connection under a lock, each
write its own ``BEGIN IMMEDIATE`` transaction (so every process sharing the file sees a
claim at once), instead of a second group-commit writer thread.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from delivery.errors import LedgerUnavailable
from storage.sqlite import files as sqlite_files
from storage.sqlite.dialect import PLACEHOLDER
from storage.sqlite.ledger import _FILE_ERRORS, _SCHEMA, APPLICATION_ID, SCHEMA_VERSION
from storage.webhooks_sql import SqlWebhooks

if TYPE_CHECKING:
    from delivery.webhooks_backend import WebhookBackend

__all__ = ["SqliteWebhooks"]


class SqliteWebhooks(SqlWebhooks):
    """``WebhookBackend`` on the ledger's SQLite file (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout_ms: int = 5000) -> None:
        super().__init__(PLACEHOLDER)
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
            sqlite_files.stamp_schema(conn, self._file, _SCHEMA)
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
                raise LedgerUnavailable("the webhook store is closed")
            with sqlite_files.immediate(conn, self._file):
                yield conn

    @contextlib.contextmanager
    def _snapshot(self) -> Iterator[sqlite3.Connection]:
        # A plain read: WAL lets it run beside the ledger's writer instead of queueing for
        # the write lock as BEGIN IMMEDIATE would.
        with self._lock:
            if self._conn is None:
                raise LedgerUnavailable("the webhook store is closed")
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
    _conforms: type[WebhookBackend] = SqliteWebhooks
