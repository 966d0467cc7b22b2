"""The PostgreSQL dialect: every store in one database (several processes or hosts).

``open_url("postgresql://user:password@host/dbname")`` checks the url (a malformed one is
refused in one line, never half-parsed), reaches the server and migrates the schema, once,
under the advisory lock (``migrate=False``, for operators' tools, only checks it; a restore,
``check=False``, does neither), so a bad url, a refused connection or wrong credentials
fail the start with one clear message. The backends opened from it never migrate again. A
backup is a ``pg_dump`` of the store's schema (``storage.postgres.backup``).
"""

from __future__ import annotations

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
from storage.dialect import Dialect, DialectName, SchemaReport, StoreName
from storage.postgres.conn import PLACEHOLDER, check_url, redact

__all__ = ["PLACEHOLDER", "PostgresDialect", "open_url"]


@dataclass(frozen=True)
class PostgresDialect:
    """The database at ``url``; ``db_schema`` is the one the migrations were applied to (or
    checked in), None before a restore has made it."""

    url: str
    db_schema: str | None

    @property
    def name(self) -> DialectName:
        return "postgres"

    @property
    def placeholder(self) -> str:
        return PLACEHOLDER

    def describe(self, store: StoreName | None = None) -> str:
        return redact(self.url)

    def schema(self, *, apply: bool) -> SchemaReport | None:
        from storage.postgres.conn import connect
        from storage.postgres.migrations import migrate, status

        conn = connect(self.url)
        try:
            applied = migrate(conn) if apply else []
            st = status(conn)
        finally:
            conn.close()
        return SchemaReport(
            redact(self.url),
            applied,
            st["current"],
            st["latest"],
            st["too_new"],
            list(st["pending"]),
        )

    def has(self, store: StoreName) -> bool:
        return True  # the migrations made every table

    def _schema(self) -> str:
        if self.db_schema is None:  # opened with check=False: only a restore goes this way
            raise RuntimeError("the PostgreSQL store was not prepared (open it with check=True)")
        return self.db_schema

    def open_ledger(self, *, operator: bool = False, **options: Any) -> LedgerStore:
        from storage.postgres.ledger import PostgresBackend

        if operator:  # one short command: one connection is plenty
            options = {"writers": 1, "pool_size": 1, **options}
        return PostgresBackend(self.url, schema=self._schema(), **options)

    def open_sessions(self, **options: Any) -> SessionBackend:
        from storage.postgres.sessions import PostgresSessions

        return PostgresSessions(self.url, **options)

    def open_webhooks(self) -> WebhookBackend:
        from storage.postgres.webhooks import PostgresWebhooks

        return PostgresWebhooks(self.url)

    def open_hooks(self) -> HookBackend:
        from storage.postgres.hooks import PostgresHooks

        return PostgresHooks(self.url)

    def open_schedules(self) -> ScheduleBackend:
        from storage.postgres.schedules import PostgresSchedules

        return PostgresSchedules(self.url)

    def open_webui(self) -> WebUIStateBackend:
        from storage.postgres.webui import PostgresWebUIState

        return PostgresWebUIState(self.url, schema=self._schema())

    def open_responses(self) -> ResponsesBackend:
        from storage.postgres.responses import PostgresResponses

        return PostgresResponses(self.url, schema=self._schema())

    def open_telegram(self) -> TelegramBackend:
        from storage.postgres.telegram import PostgresTelegram

        return PostgresTelegram(self.url)

    def reclaim_space(self, convert: bool = False) -> list[SpaceReport]:
        return []  # autovacuum gives freed pages back

    def backup(self, target: Path) -> list[str]:
        from storage.postgres.backup import dump

        return dump(self.url, self._schema(), target)

    def restore(self, source: Path) -> list[str]:
        from storage.postgres.backup import load
        from storage.postgres.migrations import prepare_database

        restored = load(self.url, source)
        # The restored schema must be the one this url's servers use, at a version they
        # know: checked the way a server's start checks it.
        prepare_database(self.url, check_only=True)
        return restored


def open_url(url: str, *, migrate: bool = True, check: bool = True) -> Dialect:
    from storage.postgres.migrations import prepare_database

    check_url(url)
    if not check:
        return PostgresDialect(url, None)
    return PostgresDialect(url, prepare_database(url, check_only=not migrate))
