"""Tests open their stores as the program does: through the storage opener, by url or file.

Short names for the shapes tests need; every one goes through ``storage.open_storage`` or
``storage.sqlite_files``, so no test constructs a dialect's backend class itself.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import storage
from delivery.backend import LedgerBackend
from delivery.session_backend import SessionBackend
from delivery.telegram_backend import TelegramBackend
from delivery.webui_state import WebUIStateBackend
from gateway.session import SessionStore

PathLike = str | os.PathLike[str]


def sqlite_ledger(path: PathLike, **options: Any) -> LedgerBackend:
    return storage.sqlite_files(ledger=path).open_ledger(**options)


def sqlite_sessions(path: PathLike, **options: Any) -> SessionBackend:
    return storage.sqlite_files(sessions=path).open_sessions(**options)


def session_file_store(path: PathLike, **options: Any) -> SessionStore:
    """A session store in the SQLite file at ``path``."""
    return SessionStore(sqlite_sessions(path, **options))


def memory_ledger(**options: Any) -> LedgerBackend:
    return storage.open_storage("memory://").open_ledger(**options)


def memory_sessions(**options: Any) -> SessionBackend:
    return storage.open_storage("memory://").open_sessions(**options)


def pg_ledger(url: str, *, migrate: bool = True, **options: Any) -> LedgerBackend:
    return storage.open_storage(url, migrate=migrate).open_ledger(**options)


def pg_sessions(url: str, *, migrate: bool = True, **options: Any) -> SessionBackend:
    return storage.open_storage(url, migrate=migrate).open_sessions(**options)


def webui_state(kind: str, directory: PathLike) -> WebUIStateBackend:
    """The web UI's state on ``kind`` ("sqlite" in ``directory``, "memory", "postgres")."""
    if kind == "sqlite":
        return storage.sqlite_files(webui=Path(directory) / "webui.db").open_webui()
    if kind == "memory":
        return storage.open_storage("memory://webui").open_webui()
    from tests.pg_support import fresh_url

    return storage.open_storage(fresh_url()).open_webui()


def telegram_backend(kind: str, directory: PathLike) -> TelegramBackend:
    """The Telegram state on ``kind`` ("sqlite": ``chats.db`` in ``directory``, "memory",
    "postgres")."""
    if kind == "sqlite":
        return storage.sqlite_files(chats=Path(directory) / "chats.db").open_telegram()
    if kind == "memory":
        return storage.open_storage("memory://telegram").open_telegram()
    from tests.pg_support import fresh_url

    return storage.open_storage(fresh_url()).open_telegram()
