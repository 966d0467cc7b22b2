"""What a storage dialect folder offers the opener: one object per folder, asked for everything.

Each dialect folder (``storage/sqlite``, ``storage/postgres``, ``storage/memory``) has a
``dialect.py`` whose ``open_url(url, migrate=...)`` turns a url of its scheme into a
``Dialect``: the url checked, the place prepared (a state directory made private, a
database's schema migrated), and from then on every question the opener and the operator
commands have for it: the SQL placeholder, which stores already exist, opening each store,
giving freed space back, a backup and a restore. The opener picks the folder once, by the
url's scheme (``storage.opener``); nothing else names a dialect.

The errors the opener's callers handle are here too, so that a dialect raises them without
importing the opener.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from delivery.backend import LedgerStore
from delivery.inbound_backend import HookBackend
from delivery.responses_backend import ResponsesBackend
from delivery.retention import SpaceReport
from delivery.schedules_backend import ScheduleBackend
from delivery.session_backend import SessionBackend
from delivery.telegram_backend import TelegramBackend
from delivery.webhooks_backend import WebhookBackend
from delivery.webui_state import WebUIStateBackend

__all__ = [
    "BackupToolMissing",
    "BackupUnavailable",
    "Dialect",
    "DialectName",
    "SchemaReport",
    "StorageUrlError",
    "StoreName",
]

DialectName = Literal["sqlite", "postgres", "memory"]
# The stores a dialect opens, by the name ``Dialect.has`` is asked with.
StoreName = Literal["ledger", "sessions", "webui", "responses", "chats"]


class StorageUrlError(ValueError):
    """A storage url that names no store this build can open (the message says why)."""


class BackupUnavailable(Exception):
    """A backup or restore this dialect cannot make here (the message says why and what to
    do instead); nothing was written."""


class BackupToolMissing(BackupUnavailable):
    """The program a dialect backs up with (``pg_dump``) is not installed here; the message
    gives the manual procedure."""


@dataclass(frozen=True)
class SchemaReport:
    """A database's schema as ``reveille db`` shows it (``redacted_url`` has no password)."""

    redacted_url: str
    applied: list[int]
    current: int
    latest: int
    too_new: bool
    pending: list[tuple[int, str]]


class Dialect(Protocol):
    """One storage dialect, prepared for one url (see the module docstring)."""

    @property
    def name(self) -> DialectName:
        """``sqlite``, ``postgres`` or ``memory``."""

    @property
    def placeholder(self) -> str:
        """The parameter mark of its SQL (``?``, ``%s``), given to the shared SQL of
        ``storage/`` (``sql.py``, ``responses_sql.py``, ...) as its ``mark``."""

    def describe(self, store: StoreName | None = None) -> str:
        """Where the stores (or ``store``) live, for messages: a directory or a file, a url
        without its password."""

    def schema(self, *, apply: bool) -> SchemaReport | None:
        """Where the schema stands, after applying what is pending when ``apply`` (under
        the lock the servers take at start); None where the stores migrate themselves as
        they open (files)."""

    def has(self, store: StoreName) -> bool:
        """Whether ``store`` exists already (an operator's tool opens only what exists, so
        that it never creates an empty file); a database holds every store."""

    def open_ledger(self, *, operator: bool = False, **options: Any) -> LedgerStore:
        """The ledger (``operator``: for one short command, the smallest pool); ``options``
        tune this dialect's backend (batch limits, pool sizes) and are passed as given."""

    def open_sessions(self, **options: Any) -> SessionBackend: ...

    def open_webhooks(self) -> WebhookBackend:
        """The outgoing webhooks' store (beside the ledger)."""

    def open_hooks(self) -> HookBackend:
        """The inbound events' store (beside the ledger)."""

    def open_schedules(self) -> ScheduleBackend:
        """The recurring schedules' store (beside the ledger)."""

    def open_webui(self) -> WebUIStateBackend: ...

    def open_responses(self) -> ResponsesBackend: ...

    def open_telegram(self) -> TelegramBackend:
        """The chat platforms' state."""

    def reclaim_space(self, convert: bool = False) -> list[SpaceReport]:
        """Give the pages retention freed back to the file system (empty where the database
        does it itself)."""

    def backup(self, target: Path) -> list[str]:
        """Copy every store, all as of one point of the ledger's history, into the new or
        empty private directory ``target``, and verify the copy; what was written there.
        ``BackupUnavailable`` when this dialect cannot (the message says what to do)."""

    def restore(self, source: Path) -> list[str]:
        """Put back the stores of a backup made by ``backup`` (into an empty place); what was
        restored. ``BackupUnavailable`` when ``source`` holds no backup of this dialect."""
