"""Compaction's writes in the SQL dialects: written once with ``?``, bound to the dialect's
placeholder ``mark`` (``storage.sql.marked``), like ``storage.running_turns``.

Each function runs inside a write transaction the backend opened (SQLite's writer thread,
a PostgreSQL connection holding the session's advisory lock) and commits nothing itself.
The rules are ``delivery.session_backend``'s: a compaction commits only under the caller's
live turn lease, archives (never deletes) rows that are not archived yet, and never a
delivery row that no stored turn has seen; a refused compaction writes nothing.
``archived_statements`` is retention's side: the archived rows that may go.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from delivery.session_backend import Compaction, MessageRecord
from storage.sql import marked

__all__ = ["archived_statements", "compact", "mark_seen"]

_CHUNK = 500  # ids per statement: far below SQLite's variable limit


def _chunks(ids: Sequence[int]) -> Iterator[list[int]]:
    unique = sorted(set(ids))
    for start in range(0, len(unique), _CHUNK):
        yield unique[start : start + _CHUNK]


def _in(n: int) -> str:
    return "(" + ", ".join(["?"] * n) + ")"


def mark_seen(conn: Any, mark: str, session_id: str, ids: Sequence[int], now: float) -> None:
    """Mark the folded delivery rows ``ids`` of the session seen by a stored turn (once:
    the first turn that saw a row is its witness)."""
    for chunk in _chunks(ids):
        conn.execute(
            marked(
                "UPDATE messages SET seen_at = ? WHERE session_id = ?"
                f" AND seen_at IS NULL AND folded_at IS NOT NULL AND id IN {_in(len(chunk))}",
                mark,
            ),
            (now, session_id, *chunk),
        )


def _allowed(conn: Any, mark: str, session_id: str, compaction: Compaction, now: float) -> bool:
    lease = conn.execute(
        marked("SELECT stream_id, expires_at FROM running_turns WHERE session_id = ?", mark),
        (session_id,),
    ).fetchone()
    if lease is None or lease[0] != compaction.stream_id or lease[1] <= now:
        return False  # not under this caller's lease: another turn may be running
    found_session = conn.execute(marked("SELECT 1 FROM sessions WHERE id = ?", mark), (session_id,))
    if found_session.fetchone() is None:
        return False
    wanted = set(compaction.archive_ids)
    if not wanted:
        return False
    found = 0
    for chunk in _chunks(compaction.archive_ids):
        rows = conn.execute(
            marked(
                "SELECT display_kind, folded_at, seen_at, archived_at FROM messages"
                f" WHERE session_id = ? AND id IN {_in(len(chunk))}",
                mark,
            ),
            (session_id, *chunk),
        ).fetchall()
        for kind, folded_at, seen_at, archived_at in rows:
            if archived_at is not None:
                return False  # compacted meanwhile (a retry after a crash finds this)
            if kind is not None and (folded_at is None or seen_at is None):
                return False  # a result no stored turn has seen stays verbatim
        found += len(rows)
    return found == len(wanted)


def compact(
    conn: Any,
    mark: str,
    session_id: str,
    compaction: Compaction,
    now: float,
    insert: Callable[[], MessageRecord],
) -> MessageRecord | None:
    """Insert the summary (``insert``) and archive the rows it replaces, or nothing at all
    (None) when the compaction is not allowed (see ``_allowed``). Checks come before any
    write, so a refusal needs no rollback."""
    if not _allowed(conn, mark, session_id, compaction, now):
        return None
    summary = insert()
    for chunk in _chunks(compaction.archive_ids):
        conn.execute(
            marked(
                "UPDATE messages SET archived_at = ?, summary_id = ?"
                f" WHERE session_id = ? AND id IN {_in(len(chunk))}",
                mark,
            ),
            (now, summary.id, session_id, *chunk),
        )
    return summary


def archived_statements(mark: str) -> tuple[str, str]:
    """(pick, prune) for retention's archived transcript rows, both bound to
    ``(before, limit)``: the ids of at most ``limit`` rows archived before ``before``, and
    the ``DELETE`` of those. The live summary is not archived, so it never qualifies; the
    delivery-row clause holds by construction (compaction archives only folded, seen rows)
    and is checked again so that a bug there can never cost a result."""
    pick = marked(
        "SELECT id FROM messages WHERE archived_at IS NOT NULL"
        " AND archived_at < ? AND (display_kind IS NULL OR folded_at IS NOT NULL)"
        " ORDER BY archived_at, id LIMIT ?",
        mark,
    )
    return pick, f"DELETE FROM messages WHERE id IN ({pick})"
