"""Running turns (leases) and their approvals in the SQL dialects: written once, bound to a
placeholder mark (``?`` for SQLite, ``%s`` for PostgreSQL).

Each function is the body of one write or read transaction on a DB-API connection the
backend opened (SQLite's writer thread, a PostgreSQL connection holding the session's
advisory lock); it runs inside that transaction and commits nothing itself. The rules are
``delivery.session_backend``'s: one holder per session, a lapsed or dead holder loses the
session to the next taker and what it asked is denied, an approval is decided once. A
background unit's approval (``unit_id``) is recorded without a lease and never denied by
one: it has ``stream_id`` empty, which no turn has.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from delivery.session_backend import ApprovalRecord, TurnLease
from storage.sql import marked

__all__ = [
    "approval_counts",
    "ask_approval",
    "decide_approval",
    "end_turn",
    "expire_approval",
    "get_approval",
    "pending_approval",
    "pending_unit_approvals",
    "renew_turn",
    "running_turns",
    "take_turn",
]

_TURN = "session_id, stream_id, owner, wakeup, started_at, expires_at"
_APPROVAL = "id, session_id, stream_id, command, status, created_at, unit_id, owner, expires_at"
# Decided approvals are kept a day, so that deciding twice is told apart from an unknown id.
_KEEP_DECIDED_SECONDS = 86400.0


class _Sql:
    """The statements, with ``?`` written as the dialect's placeholder."""

    def __init__(self, mark: str) -> None:
        def bind(sql: str) -> str:
            return marked(sql, mark)

        self.turn = bind(f"SELECT {_TURN} FROM running_turns WHERE session_id = ?")
        self.take = bind(
            f"INSERT INTO running_turns ({_TURN}) VALUES (?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (session_id) DO UPDATE SET stream_id = excluded.stream_id,"
            " owner = excluded.owner, wakeup = excluded.wakeup,"
            " started_at = excluded.started_at, expires_at = excluded.expires_at"
        )
        self.renew = bind(
            "UPDATE running_turns SET expires_at = ? WHERE session_id = ? AND stream_id = ?"
        )
        self.end = bind("DELETE FROM running_turns WHERE session_id = ? AND stream_id = ?")
        self.running = bind(f"SELECT {_TURN} FROM running_turns WHERE expires_at > ?")
        self.deny_pending = bind(
            "UPDATE approvals SET status = 'denied'"
            " WHERE session_id = ? AND stream_id = ? AND status = 'pending'"
        )
        self.prune = bind("DELETE FROM approvals WHERE status <> 'pending' AND created_at < ?")
        self.insert_approval = bind(
            f"INSERT INTO approvals ({_APPROVAL}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        self.approval = bind(f"SELECT {_APPROVAL} FROM approvals WHERE id = ?")
        self.decide = bind("UPDATE approvals SET status = ? WHERE id = ? AND status = 'pending'")
        self.unit_pending = bind(
            f"SELECT {_APPROVAL} FROM approvals WHERE status = 'pending' AND unit_id <> ''"
            " ORDER BY created_at"
        )
        self.pending = bind(
            f"SELECT {', '.join('a.' + c for c in _APPROVAL.split(', '))} FROM approvals a"
            " JOIN running_turns t"
            " ON t.session_id = a.session_id AND t.stream_id = a.stream_id"
            " WHERE a.session_id = ? AND a.status = 'pending' AND t.expires_at > ? LIMIT 1"
        )


@functools.cache
def _sql(mark: str) -> _Sql:
    return _Sql(mark)


def _lease(row: Any) -> TurnLease:
    sid, stream_id, owner, wakeup, started, expires = row
    return TurnLease(sid, stream_id, owner, bool(wakeup), started, expires)


def _approval(row: Any) -> ApprovalRecord:
    aid, sid, stream_id, command, status, created, unit_id, owner, expires = row
    return ApprovalRecord(
        aid, sid, stream_id, command, status, created, unit_id or "", owner or "", expires or 0.0
    )


def take_turn(
    conn: Any,
    mark: str,
    lease: TurnLease,
    is_dead: Callable[[str], bool],
) -> TurnLease:
    """Hold ``lease.session_id`` for ``lease`` unless a live holder has it (then its lease)."""
    q = _sql(mark)
    row = conn.execute(q.turn, (lease.session_id,)).fetchone()
    if row is not None:
        held = _lease(row)
        if held.expires_at > lease.started_at and not is_dead(held.owner):
            return held
        conn.execute(q.deny_pending, (held.session_id, held.stream_id))
    conn.execute(
        q.take,
        (
            lease.session_id,
            lease.stream_id,
            lease.owner,
            int(lease.wakeup),
            lease.started_at,
            lease.expires_at,
        ),
    )
    return lease


def renew_turn(conn: Any, mark: str, session_id: str, stream_id: str, expires_at: float) -> bool:
    return bool(conn.execute(_sql(mark).renew, (expires_at, session_id, stream_id)).rowcount)


def end_turn(conn: Any, mark: str, session_id: str, stream_id: str) -> bool:
    q = _sql(mark)
    conn.execute(q.deny_pending, (session_id, stream_id))
    return bool(conn.execute(q.end, (session_id, stream_id)).rowcount)


def running_turns(conn: Any, mark: str, now: float) -> list[TurnLease]:
    return [_lease(r) for r in conn.execute(_sql(mark).running, (now,)).fetchall()]


def ask_approval(conn: Any, mark: str, approval: ApprovalRecord) -> bool:
    q = _sql(mark)
    if not approval.background:
        row = conn.execute(q.turn, (approval.session_id,)).fetchone()
        if row is None:
            return False
        held = _lease(row)
        if held.stream_id != approval.stream_id or held.expires_at <= approval.created_at:
            return False
    conn.execute(q.prune, (approval.created_at - _KEEP_DECIDED_SECONDS,))
    conn.execute(
        q.insert_approval,
        (
            approval.id,
            approval.session_id,
            approval.stream_id,
            approval.command,
            approval.status,
            approval.created_at,
            approval.unit_id,
            approval.owner,
            approval.expires_at,
        ),
    )
    return True


def decide_approval(
    conn: Any, mark: str, approval_id: str, approve: bool
) -> tuple[ApprovalRecord, bool]:
    return _settle(conn, mark, approval_id, "approved" if approve else "denied")


def expire_approval(conn: Any, mark: str, approval_id: str) -> tuple[ApprovalRecord, bool]:
    return _settle(conn, mark, approval_id, "expired")


def _settle(conn: Any, mark: str, approval_id: str, status: str) -> tuple[ApprovalRecord, bool]:
    q = _sql(mark)
    decided = bool(conn.execute(q.decide, (status, approval_id)).rowcount)
    row = conn.execute(q.approval, (approval_id,)).fetchone()
    if row is None:
        raise KeyError(approval_id)
    return _approval(row), decided


def get_approval(conn: Any, mark: str, approval_id: str) -> ApprovalRecord | None:
    row = conn.execute(_sql(mark).approval, (approval_id,)).fetchone()
    return _approval(row) if row is not None else None


def pending_approval(conn: Any, mark: str, session_id: str, now: float) -> ApprovalRecord | None:
    row = conn.execute(_sql(mark).pending, (session_id, now)).fetchone()
    return _approval(row) if row is not None else None


def pending_unit_approvals(conn: Any, mark: str) -> list[ApprovalRecord]:
    return [_approval(r) for r in conn.execute(_sql(mark).unit_pending).fetchall()]


def approval_counts(conn: Any) -> dict[str, int]:
    """Stored approvals by status (pending, and the decided ones still kept)."""
    rows = conn.execute("SELECT status, COUNT(*) FROM approvals GROUP BY status").fetchall()
    return {str(status): int(count) for status, count in rows}
