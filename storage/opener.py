"""The one place that turns a storage url into opened stores, and so the only code that names
a storage dialect.

``open_storage(url)`` picks the dialect folder once, by the url's scheme (``_DIALECTS``),
and asks its ``open_url`` for a ``storage.dialect.Dialect``: the place checked and prepared
(``sqlite:///abs/dir``: the state directory, 0700; ``postgresql://user:password@host/dbname``:
the server reached and the schema migrated, once, under the advisory lock; ``memory://name``:
in-process stores). ``migrate=False`` (operators' tools) only checks a database's schema and
never makes a missing state directory; ``check=False`` (a restore) does neither. A bad url,
a refused connection or wrong credentials fail with one clear message.

The returned ``Storage`` opens the backends through its dialect: ``open_ledger()`` (a
``LedgerStore``), ``open_sessions()``, ``open_webui()``, ``open_webhooks()`` (in the
ledger's file or database), ``open_responses()`` and ``open_telegram()`` (an old
``telegram.db`` it is given is absorbed once and renamed ``telegram.db.migrated``);
``has(store)`` says what exists already, ``schema()``, ``backup()`` and ``restore()`` serve
the operator commands. Keyword options tune one dialect's backend and are passed as given.
``sqlite_files(ledger=..., sessions=...)`` describes SQLite files at paths of the caller's
choosing (tests, benchmarks). ``snapshot_sqlite_files`` copies SQLite files at one point of
the ledger's history.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    BackupToolMissing,
    BackupUnavailable,
    Dialect,
    DialectName,
    SchemaReport,
    StorageUrlError,
    StoreName,
)
from storage.sqlite.dialect import LEGACY_TELEGRAM_FILE, SqliteDialect

__all__ = [
    "LEGACY_TELEGRAM_FILE",
    "BackupToolMissing",
    "BackupUnavailable",
    "SchemaReport",
    "Storage",
    "StorageUrlError",
    "StoreName",
    "open_ledger_file",
    "open_storage",
    "snapshot_sqlite_files",
    "sqlite_files",
]

logger = logging.getLogger(__name__)

# Each url scheme's dialect folder; its ``dialect`` module has ``open_url``. Imported on
# first use, so that a SQLite deployment never loads the PostgreSQL driver.
_DIALECTS = {
    "sqlite": "storage.sqlite.dialect",
    "postgresql": "storage.postgres.dialect",
    "postgres": "storage.postgres.dialect",
    "memory": "storage.memory.dialect",
}


@dataclass(frozen=True)
class Storage:
    """Where the stores live, ready to open: a dialect, and what holds for every dialect
    (absorbing an old Telegram file)."""

    dialect: Dialect

    @property
    def name(self) -> DialectName:
        return self.dialect.name

    def describe(self, store: StoreName | None = None) -> str:
        return self.dialect.describe(store)

    def has(self, store: StoreName) -> bool:
        return self.dialect.has(store)

    def schema(self, *, apply: bool = False) -> SchemaReport | None:
        return self.dialect.schema(apply=apply)

    def open_ledger(self, *, operator: bool = False, **options: Any) -> LedgerStore:
        return self.dialect.open_ledger(operator=operator, **options)

    def open_sessions(self, **options: Any) -> SessionBackend:
        return self.dialect.open_sessions(**options)

    def open_webhooks(self) -> WebhookBackend:
        """The outgoing webhooks' store: in the ledger's file (SQLite) or database."""
        return self.dialect.open_webhooks()

    def open_hooks(self) -> HookBackend:
        """The inbound events' store: in the ledger's file (SQLite) or database."""
        return self.dialect.open_hooks()

    def open_schedules(self) -> ScheduleBackend:
        """The recurring schedules' store: in the ledger's file (SQLite) or database."""
        return self.dialect.open_schedules()

    def open_webui(self) -> WebUIStateBackend:
        return self.dialect.open_webui()

    def reclaim_space(self, convert: bool = False) -> list[SpaceReport]:
        """Give the pages retention freed back to the file system: SQLite's incremental
        vacuum on every file of this storage that exists (``convert``: switch a file made
        before incremental vacuum with one VACUUM). PostgreSQL reclaims by autovacuum, and
        memory has nothing to give back: empty."""
        return self.dialect.reclaim_space(convert)

    def open_responses(self) -> ResponsesBackend:
        """The Responses API's rows and stream events (``delivery.responses_backend``)."""
        return self.dialect.open_responses()

    def open_telegram(self, *, legacy_file: Path | None = None) -> TelegramBackend:
        """The Telegram adapter's state (``delivery.telegram_backend``): ``chats.db`` (SQLite)
        or tables in the database. ``legacy_file``, an old ``telegram.db``, is absorbed
        into it when it exists and then renamed ``telegram.db.migrated`` (absorbing keeps
        what the store has, so two servers starting at once may both do it)."""
        backend = self.dialect.open_telegram()
        if legacy_file is not None and legacy_file.is_file():
            try:
                _absorb_legacy_telegram(backend, legacy_file)
            except BaseException:
                backend.close()
                raise
        return backend

    def backup(self, target: Path) -> list[str]:
        """Every store, at one point of the ledger's history, into the new or empty private
        directory ``target`` (``BackupUnavailable`` says why not and what to do)."""
        return self.dialect.backup(target)

    def restore(self, source: Path) -> list[str]:
        """Put back a backup made by ``backup`` into this (empty) storage."""
        return self.dialect.restore(source)


def _absorb_legacy_telegram(backend: TelegramBackend, path: Path) -> None:
    from storage.sqlite.telegram_legacy import read_legacy_file

    dump = read_legacy_file(path)
    backend.absorb(dump)
    # Gone already: another server starting at the same time absorbed and renamed it.
    with contextlib.suppress(FileNotFoundError):
        path.rename(path.with_name(path.name + ".migrated"))
    logger.info(
        "Telegram: %s moved into the store (%d updates, %d chats); kept as %s.migrated",
        path,
        len(dump.inbox),
        len(dump.chats),
        path.name,
    )


def open_storage(url: str, *, migrate: bool = True, check: bool = True) -> Storage:
    """Resolve and prepare a storage url (see the module docstring).

    An unknown scheme is refused with a message that names the accepted ones, so that a
    typo in ``[storage] url`` stops the server at start instead of writing somewhere else.
    """
    scheme = url.partition(":")[0].lower()
    module = _DIALECTS.get(scheme)
    if module is None:
        raise StorageUrlError(
            f"storage url {url!r}: unknown scheme; expected sqlite:///<directory> "
            "or postgresql://user:password@host/dbname"
        )
    dialect: Dialect = importlib.import_module(module).open_url(url, migrate=migrate, check=check)
    return Storage(dialect)


def sqlite_files(
    *,
    ledger: str | os.PathLike[str] | None = None,
    sessions: str | os.PathLike[str] | None = None,
    webui: str | os.PathLike[str] | None = None,
    responses: str | os.PathLike[str] | None = None,
    chats: str | os.PathLike[str] | None = None,
) -> Storage:
    """SQLite stores in files the caller names (created on open, parents 0700)."""

    def path(given: str | os.PathLike[str] | None) -> Path | None:
        return Path(given) if given is not None else None

    return Storage(
        SqliteDialect(path(ledger), path(sessions), path(webui), path(responses), path(chats))
    )


def snapshot_sqlite_files(files: list[Path], fence: Path | None, target: Path) -> list[str]:
    """Copy the SQLite ``files`` into the directory ``target``, every one as of one moment in
    which the ledger file ``fence`` committed nothing (``storage.sqlite.snapshot``)."""
    from storage.sqlite.snapshot import copy_consistent

    return copy_consistent(files, fence, target)


def open_ledger_file(path: str | os.PathLike[str]) -> LedgerStore:
    """The ledger in the SQLite file at ``path``: what the contract module opens for an
    embedder that hands it a bare path (found through the ``reveille.storage`` entry point,
    so that the tools floor never names a dialect)."""
    return sqlite_files(ledger=path).open_ledger()
