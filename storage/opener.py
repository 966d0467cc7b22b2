"""The one place that turns a storage url into opened stores, and so the only code that names
a storage dialect.

``open_storage(url)`` resolves where the state lives and prepares it once:

- ``sqlite:///abs/dir``: the state directory (created 0700, or tightened); the ledger is
  ``ledger.db``, the session store ``sessions.db`` and the web UI's state ``webui.db`` in it.
- ``postgresql://user:password@host/dbname``: one database for every table. The server is
  reached and the schema migrated here, once, under the advisory lock (``migrate=False``,
  for operators' tools, only checks it), so a bad url, a refused connection or wrong
  credentials fail the start with one clear message. The backends opened from it never
  migrate again.
- ``memory://name``: in-process stores (tests, embedding); each ``open_*`` is a new one.

The returned ``Storage`` opens the backends: ``open_ledger()`` (a ``LedgerStore``: the
ledger's work and views), ``open_sessions()`` (a ``SessionBackend``) and ``open_webui()``
(a ``WebUIStateBackend``), ``open_webhooks()`` (a ``WebhookBackend``, in the ledger's
file or database), ``open_responses()`` (a ``ResponsesBackend``, ``responses.db`` with
SQLite) and ``open_telegram()`` (a ``TelegramBackend``, ``chats.db`` with SQLite; an old
``telegram.db`` it is given is absorbed once and renamed ``telegram.db.migrated``); keyword options
tune one dialect's backend (pool sizes, batch limits, a test clock) and are passed through
as given.
``sqlite_files(ledger=..., sessions=...)`` describes SQLite files at paths of the caller's
choosing (tests, benchmarks, the operator's ledger file). ``snapshot_sqlite_files`` copies
a state directory's files at one point of the ledger's history (`reveille backup`).
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

from delivery.backend import LedgerStore
from delivery.responses_backend import ResponsesBackend
from delivery.retention import SpaceReport
from delivery.schedules_backend import ScheduleBackend
from delivery.session_backend import SessionBackend
from delivery.state_dir import ensure_private_dir
from delivery.telegram_backend import TelegramBackend
from delivery.webhooks_backend import WebhookBackend
from delivery.webui_state import WebUIStateBackend

__all__ = [
    "SchemaReport",
    "Storage",
    "StorageUrlError",
    "migrate_database",
    "open_ledger_file",
    "open_storage",
    "snapshot_sqlite_files",
    "sqlite_files",
]

logger = logging.getLogger(__name__)

Dialect = Literal["sqlite", "postgres", "memory"]

LEDGER_FILE = "ledger.db"
SESSIONS_FILE = "sessions.db"
WEBUI_FILE = "webui.db"
RESPONSES_FILE = "responses.db"
CHATS_FILE = "chats.db"  # the chat platforms' state (Telegram's inbox, offset, replies)
LEGACY_TELEGRAM_FILE = "telegram.db"  # where Telegram's state lived before: absorbed once


class StorageUrlError(ValueError):
    """A storage url that names no store this build can open (the message says why)."""


@dataclass(frozen=True)
class Storage:
    """Where the ledger and the session store live, ready to open."""

    dialect: Dialect
    ledger_path: Path | None = None
    sessions_path: Path | None = None
    webui_path: Path | None = None
    responses_path: Path | None = None
    chats_path: Path | None = None
    database_url: str | None = None
    # PostgreSQL: the schema the migrations were applied to (or checked in).
    schema: str | None = None
    memory_name: str = "memory"

    def open_ledger(self, **options: Any) -> LedgerStore:
        if self.dialect == "postgres":
            from storage.postgres.ledger import PostgresBackend

            assert self.database_url is not None and self.schema is not None
            return PostgresBackend(self.database_url, schema=self.schema, **options)
        if self.dialect == "memory":
            from storage.memory.ledger import MemoryBackend

            return MemoryBackend(self.memory_name, **options)
        from storage.sqlite.ledger import SqliteBackend

        if self.ledger_path is None:
            raise StorageUrlError("this storage names no ledger file")
        return SqliteBackend(self.ledger_path, **options)

    def open_sessions(self, **options: Any) -> SessionBackend:
        if self.dialect == "postgres":
            from storage.postgres.sessions import PostgresSessions

            assert self.database_url is not None
            return PostgresSessions(self.database_url, **options)
        if self.dialect == "memory":
            from storage.memory.sessions import MemorySessions

            return MemorySessions(**options)
        from storage.sqlite.sessions import SqliteSessions

        if self.sessions_path is None:
            raise StorageUrlError("this storage names no session store file")
        return SqliteSessions(self.sessions_path, **options)

    def open_webhooks(self) -> WebhookBackend:
        """The outgoing webhooks' store: in the ledger's file (SQLite) or database."""
        if self.dialect == "postgres":
            from storage.postgres.webhooks import PostgresWebhooks

            assert self.database_url is not None
            return PostgresWebhooks(self.database_url)
        if self.dialect == "memory":
            from storage.memory.webhooks import MemoryWebhooks

            return MemoryWebhooks()
        from storage.sqlite.webhooks import SqliteWebhooks

        if self.ledger_path is None:
            raise StorageUrlError("this storage names no ledger file")
        return SqliteWebhooks(self.ledger_path)

    def open_schedules(self) -> ScheduleBackend:
        """The recurring schedules' store: in the ledger's file (SQLite) or database."""
        if self.dialect == "postgres":
            from storage.postgres.schedules import PostgresSchedules

            assert self.database_url is not None
            return PostgresSchedules(self.database_url)
        if self.dialect == "memory":
            from storage.memory.schedules import MemorySchedules

            return MemorySchedules()
        from storage.sqlite.schedules import SqliteSchedules

        if self.ledger_path is None:
            raise StorageUrlError("this storage names no ledger file")
        return SqliteSchedules(self.ledger_path)

    def open_webui(self) -> WebUIStateBackend:
        if self.dialect == "postgres":
            from storage.postgres.webui import PostgresWebUIState

            assert self.database_url is not None and self.schema is not None
            return PostgresWebUIState(self.database_url, schema=self.schema)
        if self.dialect == "memory":
            from storage.memory.webui import MemoryWebUIState

            return MemoryWebUIState()
        from storage.sqlite.webui import SqliteWebUIState

        if self.webui_path is None:
            raise StorageUrlError("this storage names no web UI state file")
        return SqliteWebUIState(self.webui_path)

    def reclaim_space(self, convert: bool = False) -> list[SpaceReport]:
        """Give the pages retention freed back to the file system: SQLite's incremental
        vacuum on every file of this storage that exists (``convert``: switch a file made
        before incremental vacuum with one VACUUM). PostgreSQL reclaims by autovacuum, and
        memory has nothing to give back: empty."""
        if self.dialect != "sqlite":
            return []
        from storage.sqlite.files import reclaim_file

        named = (
            (self.ledger_path, "ledger"),
            (self.sessions_path, "session store"),
            (self.webui_path, "web UI state"),
            (self.responses_path, "responses store"),
            (self.chats_path, "chat platforms' state"),
        )
        return [
            reclaim_file(path, name, convert=convert)
            for path, name in named
            if path is not None and path.exists()
        ]

    def open_responses(self) -> ResponsesBackend:
        """The Responses API's rows and stream events (``delivery.responses_backend``)."""
        if self.dialect == "postgres":
            from storage.postgres.responses import PostgresResponses

            assert self.database_url is not None and self.schema is not None
            return PostgresResponses(self.database_url, schema=self.schema)
        if self.dialect == "memory":
            from storage.memory.responses import MemoryResponses

            return MemoryResponses()
        from storage.sqlite.responses import SqliteResponses

        if self.responses_path is None:
            raise StorageUrlError("this storage names no responses file")
        return SqliteResponses(self.responses_path)

    def open_telegram(self, *, legacy_file: Path | None = None) -> TelegramBackend:
        """The Telegram adapter's state (``delivery.telegram_backend``): ``chats.db`` (SQLite)
        or tables in the database. ``legacy_file``, an old ``telegram.db``, is absorbed
        into it when it exists and then renamed ``telegram.db.migrated`` (absorbing keeps
        what the store has, so two servers starting at once may both do it)."""
        backend: TelegramBackend
        if self.dialect == "postgres":
            from storage.postgres.telegram import PostgresTelegram

            assert self.database_url is not None
            backend = PostgresTelegram(self.database_url)
        elif self.dialect == "memory":
            from storage.memory.telegram import MemoryTelegram

            backend = MemoryTelegram()
        else:
            from storage.sqlite.telegram import SqliteTelegram

            if self.chats_path is None:
                raise StorageUrlError("this storage names no chat platforms' state file")
            backend = SqliteTelegram(self.chats_path)
        if legacy_file is not None and legacy_file.is_file():
            try:
                _absorb_legacy_telegram(backend, legacy_file)
            except BaseException:
                backend.close()
                raise
        return backend


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


def open_storage(url: str, *, migrate: bool = True) -> Storage:
    """Resolve and prepare a storage url (see the module docstring).

    An unknown scheme is refused with a message that names the accepted ones, so that a
    typo in ``[storage] url`` stops the server at start instead of writing somewhere else.
    """
    scheme = url.partition(":")[0].lower()
    if scheme in ("postgresql", "postgres"):
        from storage.postgres.conn import check_url
        from storage.postgres.migrations import prepare_database

        check_url(url)  # a malformed url is refused in one line, never half-parsed
        schema = prepare_database(url, check_only=not migrate)
        return Storage("postgres", database_url=url, schema=schema)
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise StorageUrlError(f"storage url {url!r}: {exc}") from None
    if parts.scheme == "memory":
        return Storage("memory", memory_name=parts.netloc or "memory")
    if parts.scheme != "sqlite":
        raise StorageUrlError(
            f"storage url {url!r}: unknown scheme; expected sqlite:///<directory> "
            "or postgresql://user:password@host/dbname"
        )
    if parts.netloc:
        raise StorageUrlError(f"storage url {url!r}: a sqlite url has no host (sqlite:///path)")
    home = Path(unquote(parts.path)).expanduser()
    try:
        ensure_private_dir(home)
    except OSError as exc:
        raise StorageUrlError(f"state directory {home}: {exc}") from None
    return Storage(
        "sqlite",
        ledger_path=home / LEDGER_FILE,
        sessions_path=home / SESSIONS_FILE,
        webui_path=home / WEBUI_FILE,
        responses_path=home / RESPONSES_FILE,
        chats_path=home / CHATS_FILE,
    )


def sqlite_files(
    *,
    ledger: str | os.PathLike[str] | None = None,
    sessions: str | os.PathLike[str] | None = None,
    webui: str | os.PathLike[str] | None = None,
    responses: str | os.PathLike[str] | None = None,
    chats: str | os.PathLike[str] | None = None,
) -> Storage:
    """SQLite stores in files the caller names (created on open, parents 0700)."""
    return Storage(
        "sqlite",
        ledger_path=Path(ledger) if ledger is not None else None,
        sessions_path=Path(sessions) if sessions is not None else None,
        webui_path=Path(webui) if webui is not None else None,
        responses_path=Path(responses) if responses is not None else None,
        chats_path=Path(chats) if chats is not None else None,
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


@dataclass(frozen=True)
class SchemaReport:
    """A database's schema as ``reveille db`` shows it (``redacted_url`` has no password)."""

    redacted_url: str
    applied: list[int]
    current: int
    latest: int
    too_new: bool
    pending: list[tuple[int, str]]


def migrate_database(url: str, *, apply: bool) -> SchemaReport:
    """Where a PostgreSQL database's schema stands, after applying what is pending when
    ``apply`` (under the advisory lock the servers take at start). Raises ``LedgerError``
    (one line, never the password) when it cannot be reached or is newer than this build."""
    from storage.postgres.conn import connect, redact
    from storage.postgres.migrations import migrate, status

    conn = connect(url)
    try:
        applied = migrate(conn) if apply else []
        st = status(conn)
    finally:
        conn.close()
    return SchemaReport(
        redact(url), applied, st["current"], st["latest"], st["too_new"], list(st["pending"])
    )
