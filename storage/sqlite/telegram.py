"""The Telegram state in one SQLite file (``chats.db`` beside the ledger; the chat
platforms' state), ``delivery.telegram_backend`` over ``storage.telegram_sql``.

WAL, 0600, ``synchronous=FULL`` (an update taken is owed an answer), opened through
``storage.sqlite.files``. Each write is its own ``BEGIN IMMEDIATE`` transaction on one
connection under a lock, so every process sharing the file sees a claim or a lease at once.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from storage.sqlite import files as sqlite_files
from storage.sqlite.dialect import PLACEHOLDER
from storage.telegram_sql import DDL, SqlTelegram

if TYPE_CHECKING:
    from delivery.telegram_backend import TelegramBackend

__all__ = ["SqliteTelegram", "TelegramStateError"]

_APPLICATION_ID = 0x52434854  # "RCHT"
_SCHEMA_VERSION = 1


class TelegramStateError(RuntimeError):
    """The chat platforms' state file cannot be used (not ours, locked, unwritable)."""


class SqliteTelegram(SqlTelegram):
    """``TelegramBackend`` on a SQLite file (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout_ms: int = 5000) -> None:
        super().__init__(PLACEHOLDER)
        self._file = sqlite_files.SqliteFile(
            str(path),
            name="chat platforms' state",
            application_id=_APPLICATION_ID,
            schema_version=_SCHEMA_VERSION,
            errors=sqlite_files.FileErrors(TelegramStateError, TelegramStateError),
            busy_timeout_ms=busy_timeout_ms,
        )
        self.path = self._file.path
        sqlite_files.create_private(self._file)
        conn = sqlite_files.connect(self._file, check_owner=True)
        try:
            sqlite_files.stamp_schema(conn, self._file, DDL)
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
                raise TelegramStateError("the Telegram state is closed")
            with sqlite_files.immediate(conn, self._file):
                yield conn

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


if TYPE_CHECKING:
    _conforms: type[TelegramBackend] = SqliteTelegram
