"""The session store's rows in SQL, written once for SQLite and PostgreSQL: ``SqlSessionRows``
implements ``delivery.session_rows.SessionRows`` on a DB-API connection inside a transaction
its backend opened, with every statement bound to the dialect's placeholder mark (``?`` or
``%s``), as ``storage.sql`` does for the ledger.

A dialect subclasses it for what its SQL spells differently (``storage.sqlite.sessions``,
``storage.postgres.sessions``): a JSON edit (``supersede``), full-text search, a whole
turn's insert in one statement, the unfolded-delivery lookup. Nothing here commits.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, cast

from delivery.session_backend import (
    ApprovalRecord,
    ApprovalStatus,
    IdempotencyRecord,
    MessageHit,
    MessageRecord,
    NewMessage,
    NewSession,
    SessionRecord,
    SessionState,
    TurnLease,
    decode_json,
)
from storage.sql import marked

__all__ = [
    "MESSAGE_COLUMNS",
    "SessionSql",
    "SqlSessionRows",
    "insert_messages_sql",
    "insert_new_session_sql",
    "insert_sessions_sql",
    "message",
    "message_values",
    "session_values",
]

MESSAGE_COLUMNS = (
    "id, role, content, created_at, display_kind, display_metadata, folded_at,"
    " seen_at, archived_at, summary_id"
)
_SES = "id, source, session_key, title, created_at, updated_at"
_SES_READ = _SES + ", system_prompt, metadata"
_IDEM = "key, state, owner, session_id, response, created_at, updated_at"
_TURN = "session_id, stream_id, owner, wakeup, started_at, expires_at"
_APPROVAL = (
    "id, session_id, stream_id, command, status, created_at, unit_id, owner, expires_at,"
    " form, answer"
)
_MSG = MESSAGE_COLUMNS
_CHUNK = 500  # ids per statement: far below SQLite's variable limit


class SessionSql:
    """The statements, written with ``?`` and bound to the dialect's mark once."""

    def __init__(self, mark: str) -> None:
        self.mark = mark

        def bind(sql: str) -> str:
            return marked(sql, mark)

        self.session = bind(f"SELECT {_SES_READ} FROM sessions WHERE id = ?")
        self.live = bind("SELECT 1 FROM sessions WHERE id = ?")
        self.tombstoned = bind("SELECT 1 FROM tombstones WHERE id = ?")
        self.state = bind(
            "SELECT CASE WHEN EXISTS (SELECT 1 FROM sessions WHERE id = ?) THEN 'live'"
            " WHEN EXISTS (SELECT 1 FROM tombstones WHERE id = ?) THEN 'deleted'"
            " ELSE 'unknown' END"
        )
        self.insert_session = insert_sessions_sql(1, mark)
        self.delete_session = bind("DELETE FROM sessions WHERE id = ?")
        self.tombstone = bind(
            "INSERT INTO tombstones (id, deleted_at) VALUES (?, ?)"
            " ON CONFLICT (id) DO UPDATE SET deleted_at = excluded.deleted_at"
        )
        self.untombstone = bind("DELETE FROM tombstones WHERE id = ?")
        self.touch = bind("UPDATE sessions SET updated_at = ? WHERE id = ?")
        newest_first = "ORDER BY updated_at DESC, id ASC"
        self.sessions = bind(f"SELECT {_SES_READ} FROM sessions {newest_first} LIMIT ? OFFSET ?")
        self.session_by_key = bind(
            f"SELECT {_SES_READ} FROM sessions WHERE session_key = ? {newest_first} LIMIT 1"
        )
        # A range on the primary key: ids equal to the prefix or starting with prefix + "_"
        # ("_" < "`", so [prefix, prefix + "`") holds exactly those and the prefix itself).
        # With the prefix's tombstone on every row, and on the one row (id NULL) there is
        # when no session matches: a new conversation's lookup is one trip, not two.
        self.prefix_ids = bind(
            "SELECT s.id, t.dead FROM"
            " (SELECT EXISTS (SELECT 1 FROM tombstones WHERE id = ?) AS dead) AS t"
            " LEFT JOIN (SELECT id, created_at FROM sessions WHERE id = ? OR (id > ? AND id < ?)"
            " ORDER BY created_at, id LIMIT ?) AS s ON 1 = 1"
            " ORDER BY s.created_at, s.id"
        )
        self.set_title = bind("UPDATE sessions SET title = ? WHERE id = ?")
        self.set_title_if_untitled = self.set_title + " AND title IS NULL"
        self.set_system_prompt = bind("UPDATE sessions SET system_prompt = ? WHERE id = ?")
        self.set_metadata = bind("UPDATE sessions SET metadata = ? WHERE id = ?")
        # -- messages
        self.insert_message = bind(
            "INSERT INTO messages (session_id, role, content, created_at, display_kind,"
            " display_metadata, dedupe_key) VALUES (?, ?, ?, ?, ?, ?, ?)"
            f" ON CONFLICT (session_id, dedupe_key) DO NOTHING RETURNING {_MSG}"
        )
        self.by_dedupe = bind(
            f"SELECT {_MSG} FROM messages WHERE session_id = ? AND dedupe_key = ?"
        )
        self.after = bind(
            f"SELECT {_MSG} FROM messages WHERE session_id = ? AND id > ? ORDER BY id LIMIT ?"
        )
        self.before = bind(
            f"SELECT {_MSG} FROM messages WHERE session_id = ? AND id < ? ORDER BY id DESC LIMIT ?"
        )
        self.transcript = bind(f"SELECT {_MSG} FROM messages WHERE session_id = ? ORDER BY id")
        # What a turn reads: the transcript less the rows a compaction archived.
        self.live_transcript = bind(
            f"SELECT {_MSG} FROM messages WHERE session_id = ? AND archived_at IS NULL ORDER BY id"
        )
        self.fold = bind(
            "UPDATE messages SET folded_at = ? WHERE session_id = ? AND display_kind IS NOT NULL"
            f" AND folded_at IS NULL AND id <= ? RETURNING {_MSG}"
        )
        self.old_archived = bind(
            "SELECT id FROM messages WHERE archived_at IS NOT NULL AND archived_at < ?"
            " AND (display_kind IS NULL OR folded_at IS NOT NULL)"
            " ORDER BY archived_at, id LIMIT ?"
        )
        # -- idempotency
        self.idempotency = bind(f"SELECT {_IDEM} FROM idempotency WHERE key = ?")
        self.claim_idem = bind(
            f"INSERT INTO idempotency ({_IDEM}) VALUES (?, 'running', ?, ?, NULL, ?, ?)"
            " ON CONFLICT (key) DO UPDATE SET state = 'running', owner = excluded.owner,"
            " session_id = excluded.session_id, updated_at = excluded.updated_at"
        )
        self.finish_idem = bind(
            f"INSERT INTO idempotency ({_IDEM}) VALUES (?, 'done', NULL, ?, ?, ?, ?)"
            " ON CONFLICT (key) DO UPDATE SET state = 'done', owner = NULL,"
            " session_id = excluded.session_id, response = excluded.response,"
            " updated_at = excluded.updated_at"
        )
        self.delete_idem = bind("DELETE FROM idempotency WHERE key = ?")
        self.old_idem = bind(
            "SELECT key FROM idempotency WHERE state = 'done' AND updated_at < ?"
            " ORDER BY updated_at LIMIT ?"
        )
        self.old_tombstones = bind(
            "SELECT id FROM tombstones WHERE deleted_at < ? ORDER BY deleted_at LIMIT ?"
        )
        # -- turn leases and approvals
        self.lease = bind(f"SELECT {_TURN} FROM running_turns WHERE session_id = ?")
        self.put_lease = bind(
            f"INSERT INTO running_turns ({_TURN}) VALUES (?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (session_id) DO UPDATE SET stream_id = excluded.stream_id,"
            " owner = excluded.owner, wakeup = excluded.wakeup,"
            " started_at = excluded.started_at, expires_at = excluded.expires_at"
        )
        self.extend_lease = bind(
            "UPDATE running_turns SET expires_at = ? WHERE session_id = ? AND stream_id = ?"
        )
        self.drop_lease = bind("DELETE FROM running_turns WHERE session_id = ? AND stream_id = ?")
        self.leases = bind(f"SELECT {_TURN} FROM running_turns WHERE expires_at > ?")
        self.deny_pending = bind(
            "UPDATE approvals SET status = 'denied'"
            " WHERE session_id = ? AND stream_id = ? AND status = 'pending'"
        )
        self.forget_decided = bind(
            "DELETE FROM approvals WHERE status <> 'pending' AND created_at < ?"
        )
        self.insert_approval = bind(
            f"INSERT INTO approvals ({_APPROVAL}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        self.approval = bind(f"SELECT {_APPROVAL} FROM approvals WHERE id = ?")
        self.settle = bind(
            "UPDATE approvals SET status = ?, answer = ? WHERE id = ? AND status = 'pending'"
        )
        self.pending_of = bind(
            f"SELECT {_APPROVAL} FROM approvals WHERE session_id = ? AND stream_id = ?"
            " AND status = 'pending' LIMIT 1"
        )
        self.pending_units = (
            f"SELECT {_APPROVAL} FROM approvals WHERE status = 'pending' AND unit_id <> ''"
            " ORDER BY created_at"
        )
        self.approval_counts = "SELECT status, COUNT(*) FROM approvals GROUP BY status"

    def within(self, head: str, n: int) -> str:
        """``head`` followed by ``IN (?, ...)`` for ``n`` values, in this dialect's mark."""
        return f"{head} IN ({', '.join([self.mark] * n)})"


@functools.cache
def statements(mark: str) -> SessionSql:
    return SessionSql(mark)


def message(row: Iterable[Any]) -> MessageRecord:
    """A ``MESSAGE_COLUMNS`` row as a record."""
    mid, role, content, created, kind, meta, folded_at, seen_at, archived_at, summary_id = row
    return MessageRecord(
        mid,
        role,
        content,
        created,
        kind,
        decode_json(meta),
        folded_at is not None,
        seen=seen_at is not None,
        archived=archived_at is not None,
        summary_id=summary_id,
    )


# The columns a new message is written to, in ``message_values``' order.
MESSAGE_INSERT_COLUMNS = (
    "session_id",
    "role",
    "content",
    "created_at",
    "display_kind",
    "display_metadata",
    "dedupe_key",
)


def message_values(session_id: str, m: NewMessage, now: float) -> tuple[Any, ...]:
    return (session_id, m.role, m.content, now, m.display_kind, m.metadata_json, m.dedupe_key)


def session_values(session_id: str, new: NewSession, now: float) -> tuple[Any, ...]:
    """A new session's row, in ``insert_sessions_sql``'s columns."""
    return (session_id, new.source_json, new.session_key, new.title, now, now)


def insert_sessions_sql(rows: int, mark: str) -> str:
    """``rows`` new sessions in one INSERT (``session_values`` each); an id that exists is
    skipped."""
    one = "(" + ", ".join([mark] * len(_SES.split(", "))) + ")"
    return (
        f"INSERT INTO sessions ({_SES}) VALUES "
        + ", ".join([one] * rows)
        + " ON CONFLICT (id) DO NOTHING"
    )


def insert_new_session_sql(mark: str) -> str:
    """One new session (``session_values``, then its id again) unless a session or a
    tombstone has its id: the row count says whether it was written."""
    one = ", ".join([mark] * len(_SES.split(", ")))
    return (
        f"INSERT INTO sessions ({_SES}) SELECT {one}"
        f" WHERE NOT EXISTS (SELECT 1 FROM tombstones WHERE id = {mark})"
        " ON CONFLICT (id) DO NOTHING"
    )


def insert_messages_sql(rows: int, mark: str) -> str:
    """``rows`` new messages in one INSERT (``message_values`` each, ``mark`` the dialect's
    placeholder); a repeated dedupe key is skipped, as by ``insert_message``."""
    one = "(" + ", ".join([mark] * len(MESSAGE_INSERT_COLUMNS)) + ")"
    return (
        f"INSERT INTO messages ({', '.join(MESSAGE_INSERT_COLUMNS)}) VALUES "
        + ", ".join([one] * rows)
        + " ON CONFLICT (session_id, dedupe_key) DO NOTHING"
    )


def _session(row: Iterable[Any]) -> SessionRecord:
    sid, source, key, title, created, updated, prompt, metadata = row
    return SessionRecord(
        sid, decode_json(source), key, title, created, updated, prompt, decode_json(metadata)
    )


def _idem(row: Iterable[Any]) -> IdempotencyRecord:
    key, state, owner, sid, response, created, updated = row
    return IdempotencyRecord(key, state, owner, sid, decode_json(response), created, updated)


def _lease(row: Iterable[Any]) -> TurnLease:
    sid, stream_id, owner, wakeup, started, expires = row
    return TurnLease(sid, stream_id, owner, bool(wakeup), started, expires)


def _approval(row: Iterable[Any]) -> ApprovalRecord:
    aid, sid, stream_id, command, status, created, unit_id, owner, expires, form, answer = row
    return ApprovalRecord(
        aid,
        sid,
        stream_id,
        command,
        status,
        created,
        unit_id or "",
        owner or "",
        expires or 0.0,
        form or "",
        answer or "",
    )


def _chunks(values: Sequence[Any]) -> Iterator[list[Any]]:
    for start in range(0, len(values), _CHUNK):
        yield list(values[start : start + _CHUNK])


class SqlSessionRows:
    """``SessionRows`` on one connection inside an open transaction."""

    # LIMIT's value for "no limit" (SQLite: -1; PostgreSQL: NULL).
    no_limit: int | None = None

    def __init__(self, conn: Any, sql: SessionSql) -> None:
        self.conn = conn
        self.q = sql
        # The session these rows last inserted, and when (``created``; ``touch`` reads it).
        self._created: tuple[str, float] | None = None

    def _one(self, query: str, params: Sequence[Any]) -> Any:
        return self.conn.execute(query, tuple(params)).fetchone()

    def _all(self, query: str, params: Sequence[Any] = ()) -> list[Any]:
        return list(self.conn.execute(query, tuple(params)).fetchall())

    def _count(self, query: str, params: Sequence[Any]) -> int:
        return int(self.conn.execute(query, tuple(params)).rowcount)

    def _each_chunk(self, head: str, tail: str, before: Sequence[Any], ids: Sequence[Any]) -> int:
        """Run ``head ... IN (ids) tail`` over ``ids`` in chunks; rows changed."""
        return sum(
            self._count(self.q.within(head, len(chunk)) + tail, (*before, *chunk))
            for chunk in _chunks(ids)
        )

    # -- sessions and tombstones

    def live(self, session_id: str) -> bool:
        return self._one(self.q.live, (session_id,)) is not None

    def session(self, session_id: str) -> SessionRecord | None:
        row = self._one(self.q.session, (session_id,))
        return _session(row) if row is not None else None

    def tombstoned(self, session_id: str) -> bool:
        return self._one(self.q.tombstoned, (session_id,)) is not None

    def state(self, session_id: str) -> SessionState:
        found = str(self._one(self.q.state, (session_id, session_id))[0])
        assert found in ("live", "deleted", "unknown")
        return cast(SessionState, found)

    def insert_session(self, session_id: str, new: NewSession, now: float) -> None:
        # No row count is read: in PostgreSQL's pipeline the insert travels with the next
        # statement whose answer is read, instead of costing a trip of its own.
        self.conn.execute(self.q.insert_session, session_values(session_id, new, now))

    def insert_new_session(self, session_id: str, new: NewSession, now: float) -> bool:
        # Declined here (PostgreSQL keeps its ``state`` read, which its batches send ahead);
        # SQLite's rows do it in one statement.
        return False

    def delete_session(self, session_id: str) -> bool:
        return self._count(self.q.delete_session, (session_id,)) > 0

    def tombstone(self, session_id: str, now: float) -> None:
        self.conn.execute(self.q.tombstone, (session_id, now))

    def untombstone(self, session_id: str) -> None:
        self.conn.execute(self.q.untombstone, (session_id,))

    def created(self, session_id: str, now: float) -> None:
        """Note that these rows just inserted ``session_id`` at ``now``."""
        self._created = (session_id, now)

    def touch(self, session_id: str, now: float) -> None:
        # A session just inserted at ``now`` was updated at ``now``: the statement would
        # change nothing, and it is one less to run. (One slot: a later touch of it with
        # that same ``now`` would change nothing either, or only set its time back. SQLite's
        # writer keeps its rows for the connection's life, so the slot outlives a rolled-back
        # transaction; ``now`` is read from the clock once per operation, before it runs, so
        # only that operation, or its isolated rerun (which inserts again), touches with it.)
        if self._created != (session_id, now):
            self.conn.execute(self.q.touch, (now, session_id))  # no count read: see insert_session

    def sessions(self, limit: int, offset: int) -> list[SessionRecord]:
        return [_session(r) for r in self._all(self.q.sessions, (limit, offset))]

    def session_by_key(self, session_key: str) -> SessionRecord | None:
        row = self._one(self.q.session_by_key, (session_key,))
        return _session(row) if row is not None else None

    def prefix_ids(self, prefix: str, limit: int) -> tuple[list[str], bool]:
        params = (prefix, prefix, prefix + "_", prefix + "`", limit)
        rows = self._all(self.q.prefix_ids, params)
        return [str(r[0]) for r in rows if r[0] is not None], bool(rows[0][1])

    def set_title(self, session_id: str, title: str, *, if_untitled: bool) -> bool:
        sql = self.q.set_title_if_untitled if if_untitled else self.q.set_title
        return self._count(sql, (title, session_id)) > 0

    def set_system_prompt(self, session_id: str, prompt: str | None) -> bool:
        return self._count(self.q.set_system_prompt, (prompt, session_id)) > 0

    def set_metadata(self, session_id: str, metadata_json: str | None) -> bool:
        return self._count(self.q.set_metadata, (metadata_json, session_id)) > 0

    # -- messages

    def insert_message(self, session_id: str, message_: NewMessage, now: float) -> MessageRecord:
        row = self._one(self.q.insert_message, message_values(session_id, message_, now))
        if row is None:  # the dedupe key names an existing row: that one is the answer
            row = self._one(self.q.by_dedupe, (session_id, message_.dedupe_key))
        return message(row)

    def insert_messages(self, session_id: str, messages: Sequence[NewMessage], now: float) -> None:
        for m in messages:
            self.insert_message(session_id, m, now)

    def messages_after(
        self, session_id: str, after_id: int, limit: int | None
    ) -> list[MessageRecord]:
        bound = self.no_limit if limit is None else limit
        return [message(r) for r in self._all(self.q.after, (session_id, after_id, bound))]

    def messages_before(self, session_id: str, before_id: int, limit: int) -> list[MessageRecord]:
        rows = self._all(self.q.before, (session_id, before_id, limit))
        return [message(r) for r in reversed(rows)]

    def transcript(self, session_id: str, *, live: bool) -> list[MessageRecord]:
        sql = self.q.live_transcript if live else self.q.transcript
        return [message(r) for r in self._all(sql, (session_id,))]

    def messages_by_id(self, session_id: str, ids: Sequence[int]) -> list[MessageRecord]:
        head = f"SELECT {_MSG} FROM messages WHERE session_id = {self.q.mark} AND id"
        return [
            message(r)
            for chunk in _chunks(ids)
            for r in self._all(self.q.within(head, len(chunk)), (session_id, *chunk))
        ]

    def fold(self, session_id: str, upto: int, now: float) -> list[MessageRecord]:
        rows = self._all(self.q.fold, (now, session_id, upto))
        return sorted((message(r) for r in rows), key=lambda m: m.id)

    def mark_seen(self, session_id: str, ids: Sequence[int], now: float) -> None:
        mark = self.q.mark
        head = (
            f"UPDATE messages SET seen_at = {mark} WHERE session_id = {mark}"
            " AND seen_at IS NULL AND folded_at IS NOT NULL AND id"
        )
        self._each_chunk(head, "", (now, session_id), ids)

    def archive(self, session_id: str, ids: Sequence[int], summary_id: int, now: float) -> None:
        mark = self.q.mark
        head = (
            f"UPDATE messages SET archived_at = {mark}, summary_id = {mark}"
            f" WHERE session_id = {mark} AND id"
        )
        self._each_chunk(head, "", (now, summary_id, session_id), ids)

    def supersede(self, session_id: str, ids: Sequence[int], how: str) -> int:
        raise NotImplementedError  # each dialect edits JSON its own way

    def search(self, terms: Sequence[str], limit: int) -> list[MessageHit]:
        raise NotImplementedError  # each dialect has its own full-text index

    def unfolded_by_dedupe(self, wanted: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        head = (
            f"SELECT 1 FROM messages WHERE session_id = {self.q.mark}"
            f" AND dedupe_key = {self.q.mark} AND display_kind IS NOT NULL AND folded_at IS NULL"
        )
        return {pair for pair in wanted if self._one(head, pair) is not None}

    def old_archived(self, before: float, limit: int) -> list[int]:
        return [int(r[0]) for r in self._all(self.q.old_archived, (before, limit))]

    def delete_messages(self, ids: Sequence[int]) -> int:
        return self._each_chunk("DELETE FROM messages WHERE id", "", (), ids)

    # -- idempotency records

    def idempotency(self, key: str) -> IdempotencyRecord | None:
        row = self._one(self.q.idempotency, (key,))
        return _idem(row) if row is not None else None

    def claim_idempotency(self, key: str, owner: str, session_id: str | None, now: float) -> None:
        self.conn.execute(self.q.claim_idem, (key, owner, session_id, now, now))

    def finish_idempotency(
        self, key: str, session_id: str, response_json: str | None, now: float
    ) -> None:
        self.conn.execute(self.q.finish_idem, (key, session_id, response_json, now, now))

    def delete_idempotency(self, key: str) -> None:
        self.conn.execute(self.q.delete_idem, (key,))

    def old_idempotency(self, before: float, limit: int) -> list[str]:
        return [str(r[0]) for r in self._all(self.q.old_idem, (before, limit))]

    def forget_idempotency(self, keys: Sequence[str]) -> int:
        return self._each_chunk(
            "DELETE FROM idempotency WHERE key", " AND state = 'done'", (), keys
        )

    def old_tombstones(self, before: float, limit: int) -> list[str]:
        return [str(r[0]) for r in self._all(self.q.old_tombstones, (before, limit))]

    def forget_tombstones(self, ids: Sequence[str]) -> int:
        return self._each_chunk("DELETE FROM tombstones WHERE id", "", (), ids)

    # -- turn leases

    def lease(self, session_id: str) -> TurnLease | None:
        row = self._one(self.q.lease, (session_id,))
        return _lease(row) if row is not None else None

    def put_lease(self, lease: TurnLease) -> None:
        values = (
            lease.session_id,
            lease.stream_id,
            lease.owner,
            int(lease.wakeup),
            lease.started_at,
            lease.expires_at,
        )
        self.conn.execute(self.q.put_lease, values)

    def extend_lease(self, session_id: str, stream_id: str, expires_at: float) -> bool:
        return self._count(self.q.extend_lease, (expires_at, session_id, stream_id)) > 0

    def drop_lease(self, session_id: str, stream_id: str) -> bool:
        return self._count(self.q.drop_lease, (session_id, stream_id)) > 0

    def leases(self, alive_at: float) -> list[TurnLease]:
        return [_lease(r) for r in self._all(self.q.leases, (alive_at,))]

    # -- approvals

    def approval(self, approval_id: str) -> ApprovalRecord | None:
        row = self._one(self.q.approval, (approval_id,))
        return _approval(row) if row is not None else None

    def insert_approval(self, a: ApprovalRecord) -> None:
        values = (
            a.id,
            a.session_id,
            a.stream_id,
            a.command,
            a.status,
            a.created_at,
            a.unit_id,
            a.owner,
            a.expires_at,
            a.form,
            a.answer,
        )
        self.conn.execute(self.q.insert_approval, values)

    def settle_approval(self, approval_id: str, status: ApprovalStatus, answer: str = "") -> bool:
        return self._count(self.q.settle, (status, answer, approval_id)) > 0

    def deny_pending(self, session_id: str, stream_id: str) -> None:
        self.conn.execute(self.q.deny_pending, (session_id, stream_id))

    def forget_decided(self, before: float) -> None:
        self.conn.execute(self.q.forget_decided, (before,))

    def pending_of(self, session_id: str, stream_id: str) -> ApprovalRecord | None:
        row = self._one(self.q.pending_of, (session_id, stream_id))
        return _approval(row) if row is not None else None

    def pending_units(self) -> list[ApprovalRecord]:
        return [_approval(r) for r in self._all(self.q.pending_units)]

    def approval_counts(self) -> dict[str, int]:
        return {str(status): int(n) for status, n in self._all(self.q.approval_counts)}
