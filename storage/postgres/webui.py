"""The web UI's state in the PostgreSQL database (``delivery.webui_state``): its event log,
unread marks, finished tool steps and settings, shared by every server on every host.

An append takes a transaction-scoped advisory lock before its id is drawn, so ids are
handed out in commit order (a sequence alone would let a later id commit first, and a
reader that saw it would skip the earlier one for good). The servers poke each other with
``LISTEN/NOTIFY`` on a channel of their own, through the ledger's ``PostgresNotifier``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import psycopg
import psycopg_pool

from delivery.notifier import Notifier
from delivery.webui_state import StoredEvent, ToolStep, WebUIStateBackend
from storage.postgres.conn import PostgresUnavailable, check_url, explain, open_pool
from storage.postgres.notifier import PostgresNotifier

__all__ = ["PostgresWebUIState"]

Conn = psycopg.Connection[Any]
_APPEND_LOCK = 0x52574C47  # "RWLG": appends of the event log, one at a time


class PostgresWebUIState:
    """``WebUIStateBackend`` on a PostgreSQL database (see the module docstring)."""

    def __init__(self, url: str, *, schema: str) -> None:
        check_url(url)
        self._url = url
        self._pool: psycopg_pool.ConnectionPool[Any] | None = open_pool(
            url, name="reveille-webui", max_size=2
        )
        self._notifier = PostgresNotifier(url, f"reveille_webui_{schema}"[:63], self._pool)

    @property
    def notifier(self) -> Notifier:
        return self._notifier

    def close(self) -> None:
        self._notifier.close()
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    @contextlib.contextmanager
    def _tx(self) -> Iterator[Conn]:
        if self._pool is None:
            raise PostgresUnavailable("the web UI state is closed")
        try:
            with self._pool.connection() as conn, conn.transaction():
                yield conn
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            raise explain(exc, self._url) from exc

    # -- the event log

    def append_event(self, type_: str, data_json: str, created_at: float) -> int:
        with self._tx() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_APPEND_LOCK,))
            row = conn.execute(
                "INSERT INTO webui_events (created_at, type, data) VALUES (%s, %s, %s)"
                " RETURNING id",
                (created_at, type_, data_json),
            ).fetchone()
        assert row is not None
        return int(row[0])

    def events_after(self, after_id: int, limit: int) -> list[StoredEvent]:
        with self._tx() as conn:
            rows = conn.execute(
                "SELECT id, type, data FROM webui_events WHERE id > %s ORDER BY id LIMIT %s",
                (after_id, limit),
            ).fetchall()
        return [StoredEvent(int(r[0]), str(r[1]), str(r[2])) for r in rows]

    def oldest_event_id(self) -> int | None:
        with self._tx() as conn:
            row = conn.execute("SELECT min(id) FROM webui_events").fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def newest_event_id(self) -> int:
        with self._tx() as conn:
            row = conn.execute(
                "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM webui_events_id_seq"
            ).fetchone()
        return int(row[0]) if row is not None else 0

    def prune_events(self, keep: int) -> None:
        newest = self.newest_event_id()
        with self._tx() as conn:
            conn.execute("DELETE FROM webui_events WHERE id <= %s", (newest - keep,))

    def prune_events_before(self, before: float, limit: int, *, dry_run: bool = False) -> int:
        pick = "SELECT id FROM webui_events WHERE created_at < %s ORDER BY id LIMIT %s"
        with self._tx() as conn:
            if dry_run:
                return len(conn.execute(pick, (before, int(limit))).fetchall())
            cur = conn.execute(f"DELETE FROM webui_events WHERE id IN ({pick})", (before, limit))
            return int(cur.rowcount)

    # -- unread marks

    def set_unread(self, session_id: str, unread: bool) -> None:
        with self._tx() as conn:
            conn.execute(
                "INSERT INTO webui_unread (session_id, unread) VALUES (%s, %s)"
                " ON CONFLICT (session_id) DO UPDATE SET unread = excluded.unread",
                (session_id, unread),
            )

    def unread_ids(self) -> set[str]:
        with self._tx() as conn:
            rows = conn.execute("SELECT session_id FROM webui_unread WHERE unread").fetchall()
        return {str(r[0]) for r in rows}

    # -- finished tool steps

    def add_tool_step(
        self, session_id: str, turn_id: str, name: str, status: str, summary: str, at: float
    ) -> None:
        with self._tx() as conn:
            conn.execute(
                "INSERT INTO webui_tool_steps"
                " (session_id, turn_id, created_at, name, status, summary)"
                " VALUES (%s, %s, %s, %s, %s, %s)",
                (session_id, turn_id, at, name, status, summary),
            )

    def place_tool_steps(self, turn_id: str, message_id: int | None) -> None:
        with self._tx() as conn:
            if message_id is None:
                conn.execute("DELETE FROM webui_tool_steps WHERE turn_id = %s", (turn_id,))
            else:
                conn.execute(
                    "UPDATE webui_tool_steps SET message_id = %s WHERE turn_id = %s",
                    (message_id, turn_id),
                )

    def tool_steps(self, session_id: str, limit: int) -> list[ToolStep]:
        with self._tx() as conn:
            rows = conn.execute(
                "SELECT id, message_id, name, status, summary FROM webui_tool_steps"
                " WHERE session_id = %s ORDER BY id DESC LIMIT %s",
                (session_id, limit),
            ).fetchall()
        return [ToolStep.of_row(r) for r in reversed(rows)]

    # -- settings

    def setting(self, name: str) -> str | None:
        with self._tx() as conn:
            row = conn.execute("SELECT value FROM webui_meta WHERE name = %s", (name,)).fetchone()
        return None if row is None else str(row[0])

    def set_setting(self, name: str, value: str) -> None:
        with self._tx() as conn:
            conn.execute(
                "INSERT INTO webui_meta (name, value) VALUES (%s, %s)"
                " ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                (name, value),
            )

    def setting_or_default(self, name: str, default: str) -> str:
        with self._tx() as conn:
            conn.execute(
                "INSERT INTO webui_meta (name, value) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                (name, default),
            )
            row = conn.execute("SELECT value FROM webui_meta WHERE name = %s", (name,)).fetchone()
        assert row is not None
        return str(row[0])


# mypy proves the backend keeps the protocol, without importing it at run time.
if TYPE_CHECKING:
    _conforms: type[WebUIStateBackend] = PostgresWebUIState
