"""The Telegram state in one SQLite file (``chats.db`` beside the ledger; the chat
platforms' state), ``delivery.telegram_backend`` over ``storage.telegram_sql``.

WAL, 0600, ``synchronous=FULL`` (an update taken is owed an answer), opened through
``storage.sqlite.files``. Each write is its own ``BEGIN IMMEDIATE`` transaction on one
connection under a lock, so every process sharing the file sees a claim or a lease at once.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from storage.sqlite import files as sqlite_files
from storage.sqlite.files import PLACEHOLDER
from storage.sqlite.one_connection import OneConnectionStore
from storage.telegram_sql import DDL, SqlTelegram

if TYPE_CHECKING:
    from delivery.telegram_backend import TelegramBackend

__all__ = ["SqliteTelegram", "TelegramStateError"]

_APPLICATION_ID = 0x52434854  # "RCHT"
_SCHEMA_VERSION = 1


class TelegramStateError(RuntimeError):
    """The chat platforms' state file cannot be used (not ours, locked, unwritable)."""


class SqliteTelegram(OneConnectionStore, SqlTelegram):
    """``TelegramBackend`` on a SQLite file (see the module docstring)."""

    what = "Telegram state"

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout_ms: int = 5000) -> None:
        SqlTelegram.__init__(self, PLACEHOLDER)
        file = sqlite_files.SqliteFile(
            str(path),
            name="chat platforms' state",
            application_id=_APPLICATION_ID,
            schema_version=_SCHEMA_VERSION,
            errors=sqlite_files.FileErrors(TelegramStateError, TelegramStateError),
            busy_timeout_ms=busy_timeout_ms,
        )
        OneConnectionStore.__init__(self, file, DDL, TelegramStateError)


if TYPE_CHECKING:
    _conforms: type[TelegramBackend] = SqliteTelegram
