"""The inbound-event store's SQL, written once for both SQL dialects
(``delivery.inbound_backend``), parameterized by the placeholder mark like
``storage.webhooks_sql``. A dialect supplies ``_tx()`` (one write transaction) and may supply
``_snapshot()`` (a connection for reads).

``HOOK_DDL`` is the SQLite form of the tables (``CREATE ... IF NOT EXISTS`` only: additive,
so a ledger file of any version gains them when a build that knows them opens it); the
PostgreSQL form is a migration of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from delivery.inbound_backend import HookEvent, HookSecret
from storage.sql_tables import SqlTables

__all__ = ["HOOK_DDL", "SqlHooks"]

HOOK_DDL = """
CREATE TABLE IF NOT EXISTS hook_events (
    hook TEXT NOT NULL,
    webhook_id TEXT NOT NULL,
    received_at REAL NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (hook, webhook_id)
);
CREATE INDEX IF NOT EXISTS ix_hook_events_received ON hook_events(hook, received_at);
CREATE TABLE IF NOT EXISTS hook_secrets (
    hook TEXT NOT NULL,
    secret TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL,
    PRIMARY KEY (hook, secret)
);
"""

_EVENT = "hook, webhook_id, received_at, body"


def _event(row: Sequence[Any]) -> HookEvent:
    return HookEvent(str(row[0]), str(row[1]), float(row[2]), str(row[3]))


class SqlHooks(SqlTables):
    """``HookBackend`` over a SQL connection; subclasses give ``_tx`` and ``close``."""

    def record_event(self, event: HookEvent) -> HookEvent | None:
        with self._tx() as conn:
            # ON CONFLICT DO NOTHING (both dialects): the unique key decides, so two
            # servers taking the same event at once store it once.
            cur = conn.execute(
                self._sql(
                    f"INSERT INTO hook_events ({_EVENT}) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (hook, webhook_id) DO NOTHING"
                ),
                (event.hook, event.webhook_id, event.received_at, event.body),
            )
            if cur.rowcount == 1:
                return None
            row = conn.execute(
                self._sql(f"SELECT {_EVENT} FROM hook_events WHERE hook = ? AND webhook_id = ?"),
                (event.hook, event.webhook_id),
            ).fetchone()
        return _event(row) if row is not None else None

    def events_since(self, hook: str, since: float, limit: int) -> list[HookEvent]:
        rows = self._read(
            f"SELECT {_EVENT} FROM hook_events WHERE hook = ? AND received_at >= ? "
            "ORDER BY received_at DESC, webhook_id DESC LIMIT ?",
            (hook, since, int(limit)),
        )
        return [_event(r) for r in reversed(rows)]

    def last_events(self) -> list[HookEvent]:
        rows = self._read(
            f"SELECT {_EVENT} FROM hook_events e WHERE received_at = "
            "(SELECT MAX(received_at) FROM hook_events WHERE hook = e.hook) "
            "ORDER BY hook, webhook_id"
        )
        newest: dict[str, HookEvent] = {}
        for r in rows:
            newest.setdefault(str(r[0]), _event(r))
        return list(newest.values())

    def secrets(self, hook: str, now: float) -> list[HookSecret]:
        rows = self._read(
            "SELECT hook, secret, created_at, expires_at FROM hook_secrets "
            "WHERE hook = ? AND (expires_at IS NULL OR expires_at > ?) "
            "ORDER BY created_at DESC",
            (hook, now),
        )
        return [
            HookSecret(str(r[0]), str(r[1]), float(r[2]), None if r[3] is None else float(r[3]))
            for r in rows
        ]

    def rotate_secret(self, hook: str, secret: str, now: float, overlap_seconds: float) -> None:
        until = now + overlap_seconds
        with self._tx() as conn:
            conn.execute(
                self._sql(
                    "UPDATE hook_secrets SET expires_at = ? "
                    "WHERE hook = ? AND (expires_at IS NULL OR expires_at > ?)"
                ),
                (until, hook, until),
            )
            conn.execute(
                self._sql("INSERT INTO hook_secrets (hook, secret, created_at) VALUES (?, ?, ?)"),
                (hook, secret, now),
            )

    def prune_events(self, before: float, limit: int, *, dry_run: bool = False) -> int:
        picked = (
            "SELECT hook, webhook_id FROM hook_events WHERE received_at < ? "
            "ORDER BY received_at LIMIT ?"
        )
        if dry_run:
            rows = self._read(f"SELECT COUNT(*) FROM ({picked}) AS p", (before, int(limit)))
            return int(rows[0][0])
        with self._tx() as conn:
            cur = conn.execute(
                self._sql(f"DELETE FROM hook_events WHERE (hook, webhook_id) IN ({picked})"),
                (before, int(limit)),
            )
            return int(cur.rowcount)

    def hooks_with_secrets(self, now: float) -> list[str]:
        rows = self._read(
            "SELECT DISTINCT hook FROM hook_secrets "
            "WHERE expires_at IS NULL OR expires_at > ? ORDER BY hook",
            (now,),
        )
        return [str(r[0]) for r in rows]
