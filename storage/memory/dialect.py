"""The memory dialect: every store in this process (tests, embedding), gone when it ends.

``open_url("memory://name")``: each ``open_*`` is a new, empty store (the ledger is named
``name`` in messages). Nothing is on disk, so there is no space to reclaim and nothing to
back up.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from delivery.backend import LedgerStore
from delivery.inbound_backend import HookBackend
from delivery.responses_backend import ResponsesBackend
from delivery.retention import SpaceReport
from delivery.schedules_backend import ScheduleBackend
from delivery.session_backend import SessionBackend
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

__all__ = ["PLACEHOLDER", "MemoryDialect", "open_url"]

# The Responses API's memory store runs the shared SQL in an in-memory SQLite database.
PLACEHOLDER = "?"


@dataclass(frozen=True)
class MemoryDialect:
    """In-process stores; ``memory_name`` names the ledger in messages."""

    memory_name: str = "memory"

    @property
    def name(self) -> DialectName:
        return "memory"

    @property
    def placeholder(self) -> str:
        return PLACEHOLDER

    def describe(self, store: StoreName | None = None) -> str:
        return f"memory://{self.memory_name}"

    def schema(self, *, apply: bool) -> SchemaReport | None:
        return None  # a new store is made at the newest schema

    def has(self, store: StoreName) -> bool:
        return True  # every open makes one

    def open_ledger(self, *, operator: bool = False, **options: Any) -> LedgerStore:
        from storage.memory.ledger import MemoryBackend

        return MemoryBackend(self.memory_name, **options)

    def open_sessions(self, **options: Any) -> SessionBackend:
        from storage.memory.sessions import MemorySessions

        return MemorySessions(**options)

    def open_webhooks(self) -> WebhookBackend:
        from storage.memory.webhooks import MemoryWebhooks

        return MemoryWebhooks()

    def open_hooks(self) -> HookBackend:
        from storage.memory.hooks import MemoryHooks

        return MemoryHooks()

    def open_schedules(self) -> ScheduleBackend:
        from storage.memory.schedules import MemorySchedules

        return MemorySchedules()

    def open_webui(self) -> WebUIStateBackend:
        from storage.memory.webui import MemoryWebUIState

        return MemoryWebUIState()

    def open_responses(self) -> ResponsesBackend:
        from storage.memory.responses import MemoryResponses

        return MemoryResponses()

    def open_telegram(self) -> TelegramBackend:
        from storage.memory.telegram import MemoryTelegram

        return MemoryTelegram()

    def reclaim_space(self, convert: bool = False) -> list[SpaceReport]:
        return []  # nothing on disk to give back

    def backup(self, target: Path) -> list[str]:
        raise BackupUnavailable("memory stores live in one process and end with it")

    def restore(self, source: Path) -> list[str]:
        raise BackupUnavailable("memory stores cannot be restored into")


def open_url(url: str, *, migrate: bool = True, check: bool = True) -> Dialect:
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise StorageUrlError(f"storage url {url!r}: {exc}") from None
    return MemoryDialect(parts.netloc or "memory")
