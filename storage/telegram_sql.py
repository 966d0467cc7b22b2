"""The Telegram state's SQL, written once for both SQL dialects (``delivery.telegram_backend``).

As ``storage.webhooks_sql``: one class holds every statement, with ``?`` written as the
dialect's placeholder mark, and a dialect supplies ``_tx()`` (one write transaction) and
``close``. Every decision that must have one winner (a new update, a claim, the polling
lease) is a single conditional statement, so two servers racing on one row cannot both win:
``INSERT ... ON CONFLICT DO NOTHING`` counts the row as new for one of them only, and a claim
or lease is an ``UPDATE``/upsert whose ``WHERE`` holds for one of them only.

``DDL`` is the tables' shape (SQLite's script; PostgreSQL's migration writes the same with
its own types). The polling lease is a row of the store's ``leases`` table, named by
``delivery.telegram_backend.poll_lease_name``.
"""

from __future__ import annotations

import contextlib
from typing import Any

from delivery.telegram_backend import InboxUpdate, PollLease, TelegramDump, poll_lease_name
from storage.sql import marked

__all__ = ["DDL", "SqlTelegram"]

DDL = """
CREATE TABLE IF NOT EXISTS telegram_offsets (
    bot TEXT PRIMARY KEY,
    next_offset INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS telegram_inbox (
    bot TEXT NOT NULL,
    update_id INTEGER NOT NULL,
    payload TEXT NOT NULL,
    received_at REAL NOT NULL,
    answered_at REAL,
    holder TEXT,
    claimed_until REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (bot, update_id)
);
CREATE INDEX IF NOT EXISTS ix_telegram_inbox_open ON telegram_inbox (bot, update_id)
    WHERE answered_at IS NULL;
CREATE TABLE IF NOT EXISTS telegram_reply_parts (
    reply_key TEXT NOT NULL,
    part INTEGER NOT NULL,
    chat_id TEXT NOT NULL,
    message_id INTEGER NOT NULL,
    PRIMARY KEY (reply_key, part)
);
CREATE TABLE IF NOT EXISTS telegram_replies_done (
    reply_key TEXT PRIMARY KEY,
    done_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS telegram_chat_sessions (
    chat_key TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    started_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS chat_platform_values (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL,
    written_at REAL
);
CREATE TABLE IF NOT EXISTS leases (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    expires_at REAL NOT NULL
);
"""


class _Sql:
    """The statements, with ``?`` written as the dialect's placeholder."""

    def __init__(self, mark: str) -> None:
        def bind(sql: str) -> str:
            return marked(sql, mark)

        self.offset = bind("SELECT next_offset FROM telegram_offsets WHERE bot = ?")
        self.move_offset = bind(
            "INSERT INTO telegram_offsets (bot, next_offset) VALUES (?, ?)"
            " ON CONFLICT (bot) DO UPDATE SET next_offset = CASE"
            " WHEN excluded.next_offset > telegram_offsets.next_offset"
            " THEN excluded.next_offset ELSE telegram_offsets.next_offset END"
        )
        self.take = bind(
            "INSERT INTO telegram_inbox"
            " (bot, update_id, payload, received_at, holder, claimed_until)"
            " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (bot, update_id) DO NOTHING"
        )
        self.unanswered = bind(
            "SELECT update_id, payload, holder, claimed_until FROM telegram_inbox"
            " WHERE bot = ? AND answered_at IS NULL ORDER BY update_id"
        )
        self.claim = bind(
            "UPDATE telegram_inbox SET holder = ?, claimed_until = ?"
            " WHERE bot = ? AND update_id = ? AND answered_at IS NULL"
            " AND (holder IS NULL OR claimed_until <= ? OR holder = ? OR holder = ?)"
        )
        self.renew = bind(
            "UPDATE telegram_inbox SET claimed_until = ?"
            " WHERE bot = ? AND holder = ? AND answered_at IS NULL"
        )
        self.answered = bind(
            "UPDATE telegram_inbox SET answered_at = ?, holder = NULL"
            " WHERE bot = ? AND update_id = ? AND answered_at IS NULL"
        )
        self.lease = bind("SELECT holder, expires_at FROM leases WHERE name = ?")
        self.take_lease = bind(
            "INSERT INTO leases (name, holder, expires_at) VALUES (?, ?, ?)"
            " ON CONFLICT (name) DO UPDATE SET holder = excluded.holder,"
            " expires_at = excluded.expires_at"
            " WHERE leases.expires_at <= ? OR leases.holder = excluded.holder"
            " OR leases.holder = ?"
        )
        self.release_lease = bind("DELETE FROM leases WHERE name = ? AND holder = ?")
        self.parts = bind("SELECT part, message_id FROM telegram_reply_parts WHERE reply_key = ?")
        self.record_part = bind(
            "INSERT INTO telegram_reply_parts (reply_key, part, chat_id, message_id)"
            " VALUES (?, ?, ?, ?) ON CONFLICT (reply_key, part) DO UPDATE SET"
            " chat_id = excluded.chat_id, message_id = excluded.message_id"
        )
        self.add_part = bind(
            "INSERT INTO telegram_reply_parts (reply_key, part, chat_id, message_id)"
            " VALUES (?, ?, ?, ?) ON CONFLICT (reply_key, part) DO NOTHING"
        )
        self.finished = bind("SELECT 1 FROM telegram_replies_done WHERE reply_key = ?")
        self.finish = bind(
            "INSERT INTO telegram_replies_done (reply_key, done_at) VALUES (?, ?)"
            " ON CONFLICT (reply_key) DO NOTHING"
        )
        self.value = bind("SELECT value FROM chat_platform_values WHERE name = ?")
        self.set_value = bind(
            "INSERT INTO chat_platform_values (name, value, written_at) VALUES (?, ?, ?)"
            " ON CONFLICT (name) DO UPDATE SET value = excluded.value,"
            " written_at = excluded.written_at"
        )
        self.prune_values = bind("DELETE FROM chat_platform_values WHERE written_at < ?")
        self.chat = bind("SELECT session_id FROM telegram_chat_sessions WHERE chat_key = ?")
        self.start_chat = bind(
            "INSERT INTO telegram_chat_sessions (chat_key, session_id, started_at)"
            " VALUES (?, ?, ?) ON CONFLICT (chat_key) DO UPDATE SET"
            " session_id = excluded.session_id, started_at = excluded.started_at"
        )
        self.add_chat = bind(
            "INSERT INTO telegram_chat_sessions (chat_key, session_id, started_at)"
            " VALUES (?, ?, ?) ON CONFLICT (chat_key) DO NOTHING"
        )
        self.absorb_inbox = bind(
            "INSERT INTO telegram_inbox (bot, update_id, payload, received_at, answered_at)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT (bot, update_id) DO NOTHING"
        )
        self.prune_inbox = bind(
            "DELETE FROM telegram_inbox WHERE answered_at IS NOT NULL AND answered_at < ?"
        )
        self.prune_parts = bind(
            "DELETE FROM telegram_reply_parts WHERE reply_key IN"
            " (SELECT reply_key FROM telegram_replies_done WHERE done_at < ?)"
        )
        self.prune_done = bind("DELETE FROM telegram_replies_done WHERE done_at < ?")


class SqlTelegram:
    """``TelegramBackend`` over a SQL connection; subclasses give ``_tx`` and ``close``."""

    def __init__(self, mark: str) -> None:
        """``mark``: the dialect's placeholder (``storage.sql.marked``)."""
        self._sql = _Sql(mark)

    def _tx(self) -> contextlib.AbstractContextManager[Any]:
        """A connection inside one write transaction (committed when the block ends)."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    # -- intake

    def next_offset(self, bot: str) -> int | None:
        with self._tx() as conn:
            row = conn.execute(self._sql.offset, (bot,)).fetchone()
        return int(row[0]) if row is not None else None

    def take_updates(
        self,
        bot: str,
        updates: list[tuple[int, str]],
        *,
        holder: str,
        now: float,
        claim_seconds: float,
        move_offset: bool = True,
    ) -> list[int]:
        fresh: list[int] = []
        with self._tx() as conn:
            for update_id, payload in updates:
                cur = conn.execute(
                    self._sql.take,
                    (bot, int(update_id), payload, now, holder, now + claim_seconds),
                )
                if cur.rowcount == 1:
                    fresh.append(int(update_id))
            if move_offset and updates:
                nxt = max(int(u) for u, _ in updates) + 1
                conn.execute(self._sql.move_offset, (bot, nxt))
        return fresh

    def unanswered(self, bot: str) -> list[InboxUpdate]:
        with self._tx() as conn:
            rows = conn.execute(self._sql.unanswered, (bot,)).fetchall()
        return [
            InboxUpdate(int(r[0]), str(r[1]), None if r[2] is None else str(r[2]), float(r[3]))
            for r in rows
        ]

    def claim(
        self,
        bot: str,
        update_id: int,
        holder: str,
        *,
        now: float,
        claim_seconds: float,
        dead_holder: str | None = None,
    ) -> bool:
        with self._tx() as conn:
            cur = conn.execute(
                self._sql.claim,
                (holder, now + claim_seconds, bot, int(update_id), now, holder, dead_holder),
            )
            return int(cur.rowcount) == 1

    def renew_claims(self, bot: str, holder: str, *, now: float, claim_seconds: float) -> int:
        with self._tx() as conn:
            cur = conn.execute(self._sql.renew, (now + claim_seconds, bot, holder))
            return int(cur.rowcount)

    def mark_answered(self, bot: str, update_id: int, *, now: float) -> None:
        with self._tx() as conn:
            conn.execute(self._sql.answered, (now, bot, int(update_id)))

    # -- the polling lease

    def poll_lease(self, bot: str) -> PollLease | None:
        with self._tx() as conn:
            row = conn.execute(self._sql.lease, (poll_lease_name(bot),)).fetchone()
        return None if row is None else PollLease(str(row[0]), float(row[1]))

    def take_poll_lease(
        self,
        bot: str,
        holder: str,
        *,
        now: float,
        ttl_seconds: float,
        dead_holder: str | None = None,
    ) -> bool:
        name = poll_lease_name(bot)
        with self._tx() as conn:
            cur = conn.execute(
                self._sql.take_lease, (name, holder, now + ttl_seconds, now, dead_holder)
            )
            return int(cur.rowcount) == 1

    def release_poll_lease(self, bot: str, holder: str) -> None:
        with self._tx() as conn:
            conn.execute(self._sql.release_lease, (poll_lease_name(bot), holder))

    # -- replies

    def reply_parts(self, key: str) -> dict[int, int]:
        with self._tx() as conn:
            rows = conn.execute(self._sql.parts, (key,)).fetchall()
        return {int(part): int(mid) for part, mid in rows}

    def record_part(self, key: str, part: int, chat_id: str, message_id: int) -> None:
        with self._tx() as conn:
            conn.execute(self._sql.record_part, (key, int(part), chat_id, int(message_id)))

    def reply_finished(self, key: str) -> bool:
        with self._tx() as conn:
            return conn.execute(self._sql.finished, (key,)).fetchone() is not None

    def finish_reply(self, key: str, *, now: float) -> None:
        with self._tx() as conn:
            conn.execute(self._sql.finish, (key, now))

    # -- conversations

    def chat_session(self, chat_key: str) -> str | None:
        with self._tx() as conn:
            row = conn.execute(self._sql.chat, (chat_key,)).fetchone()
        return None if row is None else str(row[0])

    def start_chat_session(self, chat_key: str, session_id: str, *, now: float) -> None:
        with self._tx() as conn:
            conn.execute(self._sql.start_chat, (chat_key, session_id, now))

    # -- a platform's own values

    def platform_value(self, name: str) -> str | None:
        with self._tx() as conn:
            row = conn.execute(self._sql.value, (name,)).fetchone()
        return None if row is None else str(row[0])

    def set_platform_value(self, name: str, value: str, *, written_at: float | None = None) -> None:
        with self._tx() as conn:
            conn.execute(self._sql.set_value, (name, value, written_at))

    # -- housekeeping

    def prune(self, before: float) -> None:
        with self._tx() as conn:
            conn.execute(self._sql.prune_inbox, (before,))
            conn.execute(self._sql.prune_parts, (before,))
            conn.execute(self._sql.prune_done, (before,))
            conn.execute(self._sql.prune_values, (before,))

    def absorb(self, dump: TelegramDump) -> None:
        with self._tx() as conn:
            for bot, nxt in dump.offsets.items():
                conn.execute(self._sql.move_offset, (bot, int(nxt)))
            for u in dump.inbox:
                conn.execute(
                    self._sql.absorb_inbox,
                    (u.bot, u.update_id, u.payload_json, u.received_at, u.answered_at),
                )
            for p in dump.parts:
                conn.execute(self._sql.add_part, (p.reply_key, p.part, p.chat_id, p.message_id))
            for d in dump.done:
                conn.execute(self._sql.finish, (d.reply_key, d.done_at))
            for c in dump.chats:
                conn.execute(self._sql.add_chat, (c.chat_key, c.session_id, c.started_at))
