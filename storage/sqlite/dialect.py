"""The SQLite dialect: every store a file of its own in the state directory.

``open_url("sqlite:///abs/dir")`` names the state directory (created 0700, or tightened;
an operator's tool, ``migrate=False``, leaves a missing one missing): the ledger is
``ledger.db``, the session store ``sessions.db``, the web UI's state ``webui.db``, the
Responses API's ``responses.db`` and the chat platforms' ``chats.db``, each made on first
open. ``SqliteDialect(ledger=..., ...)`` names files at paths of the caller's choosing
(tests, benchmarks). A backup is every file copied at one point of the ledger's history
(``storage.sqlite.snapshot``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from delivery.backend import LedgerStore
from delivery.inbound_backend import HookBackend
from delivery.responses_backend import ResponsesBackend
from delivery.retention import SpaceReport
from delivery.schedules_backend import ScheduleBackend
from delivery.session_backend import SessionBackend
from delivery.state_dir import ensure_private_dir
from delivery.telegram_backend import TelegramBackend
from delivery.webhooks_backend import WebhookBackend
from delivery.webui_state import WebUIStateBackend
from storage.dialect import (
    BackupUnavailable,
    Dialect,
    DialectName,
    SchemaReport,
    StorageUrlError,
    StoreName,
)
from storage.sqlite.files import PLACEHOLDER

__all__ = ["FILES", "LEGACY_TELEGRAM_FILE", "PLACEHOLDER", "SqliteDialect", "open_url"]


# Each store's file in a state directory.
FILES: dict[StoreName, str] = {
    "ledger": "ledger.db",
    "sessions": "sessions.db",
    "webui": "webui.db",
    "responses": "responses.db",
    "chats": "chats.db",  # the chat platforms' state (Telegram's inbox, offset, replies)
}
LEGACY_TELEGRAM_FILE = "telegram.db"  # where Telegram's state lived before: absorbed once

_HUMAN: dict[StoreName, str] = {
    "ledger": "ledger",
    "sessions": "session store",
    "webui": "web UI state",
    "responses": "responses store",
    "chats": "chat platforms' state",
}


@dataclass(frozen=True)
class SqliteDialect:
    """SQLite files: those of the state directory ``home``, or the ones named."""

    ledger_path: Path | None = None
    sessions_path: Path | None = None
    webui_path: Path | None = None
    responses_path: Path | None = None
    chats_path: Path | None = None
    home: Path | None = None

    @classmethod
    def in_directory(cls, home: Path) -> SqliteDialect:
        return cls(
            ledger_path=home / FILES["ledger"],
            sessions_path=home / FILES["sessions"],
            webui_path=home / FILES["webui"],
            responses_path=home / FILES["responses"],
            chats_path=home / FILES["chats"],
            home=home,
        )

    @property
    def name(self) -> DialectName:
        return "sqlite"

    @property
    def placeholder(self) -> str:
        return PLACEHOLDER

    def describe(self, store: StoreName | None = None) -> str:
        if store is not None:
            return str(self.path(store))
        return str(self.home) if self.home is not None else "SQLite files"

    def path(self, store: StoreName) -> Path:
        """The file of ``store``, or ``StorageUrlError`` when this dialect names none."""
        found = {
            "ledger": self.ledger_path,
            "sessions": self.sessions_path,
            "webui": self.webui_path,
            "responses": self.responses_path,
            "chats": self.chats_path,
        }[store]
        if found is None:
            raise StorageUrlError(f"this storage names no {_HUMAN[store]} file")
        return found

    def schema(self, *, apply: bool) -> SchemaReport | None:
        return None  # each file migrates itself as it opens

    def has(self, store: StoreName) -> bool:
        try:
            return self.path(store).exists()
        except StorageUrlError:
            return False

    def open_ledger(self, *, operator: bool = False, **options: Any) -> LedgerStore:
        from storage.sqlite.ledger import SqliteBackend

        return SqliteBackend(self.path("ledger"), **options)

    def open_sessions(self, **options: Any) -> SessionBackend:
        from storage.sqlite.sessions import SqliteSessions

        return SqliteSessions(self.path("sessions"), **options)

    def open_webhooks(self) -> WebhookBackend:
        from storage.sqlite.webhooks import SqliteWebhooks

        return SqliteWebhooks(self.path("ledger"))  # in the ledger's file

    def open_hooks(self) -> HookBackend:
        from storage.sqlite.hooks import SqliteHooks

        return SqliteHooks(self.path("ledger"))  # in the ledger's file

    def open_schedules(self) -> ScheduleBackend:
        from storage.sqlite.schedules import SqliteSchedules

        return SqliteSchedules(self.path("ledger"))  # in the ledger's file

    def open_webui(self) -> WebUIStateBackend:
        from storage.sqlite.webui import SqliteWebUIState

        return SqliteWebUIState(self.path("webui"))

    def open_responses(self) -> ResponsesBackend:
        from storage.sqlite.responses import SqliteResponses

        return SqliteResponses(self.path("responses"))

    def open_telegram(self) -> TelegramBackend:
        from storage.sqlite.telegram import SqliteTelegram

        return SqliteTelegram(self.path("chats"))

    def reclaim_space(self, convert: bool = False) -> list[SpaceReport]:
        from storage.sqlite.files import reclaim_file

        return [
            reclaim_file(self.path(store), name, convert=convert)
            for store, name in _HUMAN.items()
            if self.has(store)
        ]

    def _backup_files(self, home: Path) -> list[Path]:
        names = [*FILES.values(), LEGACY_TELEGRAM_FILE]
        return [home / name for name in names if (home / name).is_file()]

    def backup(self, target: Path) -> list[str]:
        from storage.sqlite.snapshot import copy_consistent

        if self.home is None or not self.home.is_dir():
            raise BackupUnavailable(f"state directory {self.describe()} does not exist")
        files = self._backup_files(self.home)
        return copy_consistent(files, self.home / FILES["ledger"], target)

    def restore(self, source: Path) -> list[str]:
        from storage.sqlite.snapshot import copy_consistent

        if self.home is None:
            raise BackupUnavailable("these SQLite files have no state directory to restore to")
        files = self._backup_files(source)
        if not files:
            raise BackupUnavailable(f"{source} holds no Reveille store; nothing was written")
        return copy_consistent(files, None, self.home)


def open_url(url: str, *, migrate: bool = True, check: bool = True) -> Dialect:
    """The state directory a ``sqlite:///path`` url names, made private (``migrate=False``:
    a missing one is left missing, for operators' tools that only look)."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise StorageUrlError(f"storage url {url!r}: {exc}") from None
    if parts.netloc:
        raise StorageUrlError(f"storage url {url!r}: a sqlite url has no host (sqlite:///path)")
    home = Path(unquote(parts.path)).expanduser()
    if migrate or home.exists():
        try:
            ensure_private_dir(home)
        except OSError as exc:
            raise StorageUrlError(f"state directory {home}: {exc}") from None
    return SqliteDialect.in_directory(home)
