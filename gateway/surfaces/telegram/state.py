"""The Telegram adapter's durable state: the update inbox with its offset, and sent replies.

One small SQLite file (``telegram.db`` under the state directory), WAL, ``synchronous=FULL``.

* Intake. ``take_updates`` stores the updates a ``getUpdates`` call returned and moves the
  offset past them in ONE transaction: from then on they are ours (the next ``getUpdates``
  confirms them to Telegram) and live in the inbox until answered. After a crash the inbox
  still holds every update that was not answered, and the offset never points before one
  that was taken: no update is lost, and none is taken twice. Webhook updates go into the
  same inbox (keyed by update id, so a webhook retry of the same update is ignored).
* Answers. The turn of an update runs under the idempotency key ``telegram:<bot>:update:<id>``
  (the session store's records), so a second run after a crash replays the stored answer
  instead of running the agent again. Each message a reply was sent as is recorded here
  (``record_part``) the moment Telegram returns its id; a repeated answer edits those
  messages instead of sending new ones, and ``finish_reply`` marks the reply complete.
  Only a crash between Telegram accepting a message and this file recording its id can
  repeat one message (at most once).
* Conversations. ``/new`` starts a fresh session for a chat: ``chat_sessions`` maps the
  chat's routing key to the session its messages go to now (none: the key itself, the
  chat's first session). Old sessions are never touched, so they stay readable and their
  late background results still come home to them. (Schema version 2 added this table;
  a version 1 file gains it when opened.)
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from gateway.surfaces.telegram.updates import update_id_of
from storage.sqlite import files as sqlite_files

__all__ = ["STATE_FILE", "TelegramState", "TelegramStateError"]

STATE_FILE = "telegram.db"  # under the state directory

SCHEMA_VERSION = 2
_APPLICATION_ID = 0x5254_4731  # "RTG1"

_DDL = """
CREATE TABLE IF NOT EXISTS offsets (
    bot TEXT PRIMARY KEY,
    next_offset INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS inbox (
    bot TEXT NOT NULL,
    update_id INTEGER NOT NULL,
    payload TEXT NOT NULL,
    received_at REAL NOT NULL,
    answered_at REAL,
    PRIMARY KEY (bot, update_id)
);
CREATE TABLE IF NOT EXISTS reply_parts (
    reply_key TEXT NOT NULL,
    part INTEGER NOT NULL,
    chat_id TEXT NOT NULL,
    message_id INTEGER NOT NULL,
    PRIMARY KEY (reply_key, part)
);
CREATE TABLE IF NOT EXISTS chat_sessions (
    chat_key TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    started_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS replies_done (
    reply_key TEXT PRIMARY KEY,
    done_at REAL NOT NULL
);
"""

# Answered updates and finished replies are kept this long (a webhook may resend one).
_KEEP_SECONDS = 7 * 24 * 3600.0


class TelegramStateError(RuntimeError):
    """The Telegram state file cannot be used."""


class TelegramState:
    """Synchronous; the adapter calls it through ``asyncio.to_thread``."""

    def __init__(self, path: str | Path) -> None:
        self._spec = sqlite_files.SqliteFile(
            path=str(path),
            name="telegram state",
            application_id=_APPLICATION_ID,
            schema_version=SCHEMA_VERSION,
            errors=sqlite_files.FileErrors(
                not_ours=TelegramStateError, unavailable=TelegramStateError
            ),
        )
        sqlite_files.create_private(self._spec)
        self._conn = sqlite_files.connect(self._spec, check_owner=True)
        sqlite_files.stamp_schema(self._conn, self._spec, _DDL)
        self._lock = threading.Lock()
        self.prune()

    @property
    def path(self) -> Path:
        return Path(self._spec.path)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _tx(self, fn: Any) -> Any:
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                result = fn(self._conn)
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")
            return result

    # ----------------------------------------------------------------- intake

    def next_offset(self, bot: str) -> int | None:
        with self._lock:
            row = self._conn.execute(
                "SELECT next_offset FROM offsets WHERE bot = ?", (bot,)
            ).fetchone()
        return int(row[0]) if row else None

    def take_updates(
        self, bot: str, updates: list[dict[str, Any]], *, move_offset: bool = True
    ) -> list[tuple[int, dict[str, Any]]]:
        """Store ``updates`` in the inbox and (polling) move the offset past them, atomically.

        Returns the updates that were new, in update-id order; ones already taken (a
        repeated webhook call, an update handed out twice) are left out.
        """
        # An id no update can have (``update_id_of``) is left out: stored, it would fail
        # the whole transaction and so block every later update.
        valid = [u for u in updates if update_id_of(u) is not None]
        valid.sort(key=lambda u: int(u["update_id"]))
        now = time.time()

        def op(conn: sqlite3.Connection) -> list[tuple[int, dict[str, Any]]]:
            fresh: list[tuple[int, dict[str, Any]]] = []
            for update in valid:
                cur = conn.execute(
                    "INSERT OR IGNORE INTO inbox (bot, update_id, payload, received_at) "
                    "VALUES (?, ?, ?, ?)",
                    (bot, int(update["update_id"]), json.dumps(update), now),
                )
                if cur.rowcount:
                    fresh.append((int(update["update_id"]), update))
            if move_offset and valid:
                nxt = int(valid[-1]["update_id"]) + 1
                conn.execute(
                    "INSERT INTO offsets (bot, next_offset) VALUES (?, ?) ON CONFLICT(bot) "
                    "DO UPDATE SET next_offset = max(next_offset, excluded.next_offset)",
                    (bot, nxt),
                )
            return fresh

        result: list[tuple[int, dict[str, Any]]] = self._tx(op)
        return result

    def unanswered(self, bot: str) -> list[tuple[int, dict[str, Any]]]:
        """Updates taken but not answered yet (a previous run died first), oldest first."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT update_id, payload FROM inbox WHERE bot = ? AND answered_at IS NULL "
                "ORDER BY update_id",
                (bot,),
            ).fetchall()
        return [(int(uid), json.loads(payload)) for uid, payload in rows]

    def mark_answered(self, bot: str, update_id: int) -> None:
        self._tx(
            lambda conn: conn.execute(
                "UPDATE inbox SET answered_at = ? WHERE bot = ? AND update_id = ?",
                (time.time(), bot, update_id),
            )
        )

    # ----------------------------------------------------------------- replies

    def reply_parts(self, key: str) -> dict[int, int]:
        """The messages a reply was already sent as: part index -> message id."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT part, message_id FROM reply_parts WHERE reply_key = ?", (key,)
            ).fetchall()
        return {int(part): int(mid) for part, mid in rows}

    def record_part(self, key: str, part: int, chat_id: str, message_id: int) -> None:
        self._tx(
            lambda conn: conn.execute(
                "INSERT OR REPLACE INTO reply_parts (reply_key, part, chat_id, message_id) "
                "VALUES (?, ?, ?, ?)",
                (key, part, chat_id, message_id),
            )
        )

    def reply_finished(self, key: str) -> bool:
        with self._lock:
            row = self._conn.execute(
                "SELECT 1 FROM replies_done WHERE reply_key = ?", (key,)
            ).fetchone()
        return row is not None

    def finish_reply(self, key: str) -> None:
        self._tx(
            lambda conn: conn.execute(
                "INSERT OR IGNORE INTO replies_done (reply_key, done_at) VALUES (?, ?)",
                (key, time.time()),
            )
        )

    # ----------------------------------------------------------------- conversations

    def chat_session(self, chat_key: str) -> str | None:
        """The session a chat's messages go to now, when ``/new`` chose one."""
        with self._lock:
            row = self._conn.execute(
                "SELECT session_id FROM chat_sessions WHERE chat_key = ?", (chat_key,)
            ).fetchone()
        return str(row[0]) if row is not None else None

    def start_chat_session(self, chat_key: str, session_id: str) -> None:
        self._tx(
            lambda conn: conn.execute(
                "INSERT OR REPLACE INTO chat_sessions (chat_key, session_id, started_at) "
                "VALUES (?, ?, ?)",
                (chat_key, session_id, time.time()),
            )
        )

    # ----------------------------------------------------------------- housekeeping

    def prune(self, keep_seconds: float = _KEEP_SECONDS) -> None:
        cutoff = time.time() - keep_seconds

        def op(conn: sqlite3.Connection) -> None:
            conn.execute(
                "DELETE FROM inbox WHERE answered_at IS NOT NULL AND answered_at < ?", (cutoff,)
            )
            old = [
                r[0]
                for r in conn.execute(
                    "SELECT reply_key FROM replies_done WHERE done_at < ?", (cutoff,)
                ).fetchall()
            ]
            for key in old:
                conn.execute("DELETE FROM reply_parts WHERE reply_key = ?", (key,))
                conn.execute("DELETE FROM replies_done WHERE reply_key = ?", (key,))

        self._tx(op)
