"""The schedules table's SQL, written once for both SQL dialects
(``delivery.schedules_backend``), parameterized by the placeholder mark like
``storage.webhooks_sql``. A dialect supplies ``_tx()`` (one write transaction) and
``close``; SQLite's DDL is ``SCHEDULES_DDL``, PostgreSQL's a migration."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from delivery.schedules import ACTIVE, CANCELLED, PAUSED, Misfire, Schedule
from storage.sql_tables import SqlTables

__all__ = ["SCHEDULES_DDL", "SqlSchedules"]

SCHEDULES_DDL = """
CREATE TABLE IF NOT EXISTS schedules (
    id TEXT PRIMARY KEY,
    note TEXT NOT NULL,
    cron TEXT,
    zone TEXT NOT NULL,
    every_seconds DOUBLE PRECISION,
    anchor DOUBLE PRECISION NOT NULL,
    misfire TEXT NOT NULL,
    misfire_within DOUBLE PRECISION,
    target TEXT NOT NULL,
    state TEXT NOT NULL,
    session_key TEXT,
    origin_session_id TEXT,
    origin_ui_session_id TEXT,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    next_at DOUBLE PRECISION,
    fired INTEGER NOT NULL DEFAULT 0,
    missed INTEGER NOT NULL DEFAULT 0,
    last_fired_at DOUBLE PRECISION
);
CREATE INDEX IF NOT EXISTS ix_schedules_due ON schedules(next_at) WHERE state = 'active';
CREATE INDEX IF NOT EXISTS ix_schedules_session ON schedules(session_key);
CREATE INDEX IF NOT EXISTS ix_schedules_origin ON schedules(origin_session_id);
CREATE INDEX IF NOT EXISTS ix_schedules_ui ON schedules(origin_ui_session_id);
"""

_COLUMNS = (
    "id, note, cron, zone, every_seconds, anchor, misfire, misfire_within, target, state, "
    "session_key, origin_session_id, origin_ui_session_id, created_at, updated_at, next_at, "
    "fired, missed, last_fired_at"
)


def _opt(value: Any) -> float | None:
    return None if value is None else float(value)


def _schedule(row: Sequence[Any]) -> Schedule:
    return Schedule(
        id=str(row[0]),
        note=str(row[1]),
        cron=row[2],
        zone=str(row[3]),
        every_seconds=_opt(row[4]),
        anchor=float(row[5]),
        misfire=Misfire(row[6], _opt(row[7])),
        target=row[8],
        state=str(row[9]),
        session_key=row[10],
        origin_session_id=row[11],
        origin_ui_session_id=row[12],
        created_at=float(row[13]),
        updated_at=float(row[14]),
        next_at=_opt(row[15]),
        fired=int(row[16]),
        missed=int(row[17]),
        last_fired_at=_opt(row[18]),
    )


# Cancelled schedules last, then the soonest to come.
_ORDER = (
    f" ORDER BY CASE state WHEN '{ACTIVE}' THEN 0 WHEN '{PAUSED}' THEN 1 ELSE 2 END,"
    " next_at, created_at, id"
)
_SESSION = " AND (session_key = ? OR origin_session_id = ? OR origin_ui_session_id = ?)"


class SqlSchedules(SqlTables):
    """``ScheduleBackend`` over a SQL connection; subclasses give ``_tx`` and ``close``."""

    def add(self, schedule: Schedule) -> None:
        s = schedule
        self._write(
            f"INSERT INTO schedules ({_COLUMNS}) VALUES "
            "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                s.id,
                s.note,
                s.cron,
                s.zone,
                s.every_seconds,
                s.anchor,
                s.misfire.policy,
                s.misfire.within_seconds,
                s.target,
                s.state,
                s.session_key,
                s.origin_session_id,
                s.origin_ui_session_id,
                s.created_at,
                s.updated_at,
                s.next_at,
                s.fired,
                s.missed,
                s.last_fired_at,
            ),
        )

    def get(self, schedule_id: str) -> Schedule | None:
        rows = self._read(f"SELECT {_COLUMNS} FROM schedules WHERE id = ?", (schedule_id,))
        return _schedule(rows[0]) if rows else None

    def find(
        self, *, session: str | None = None, states: Sequence[str] | None = None, limit: int = 100
    ) -> list[Schedule]:
        where, params = " WHERE 1 = 1", []
        if session is not None:
            where += _SESSION
            params += [session, session, session]
        if states is not None:
            if not states:
                return []
            where += f" AND state IN ({', '.join('?' for _ in states)})"
            params += list(states)
        sql = f"SELECT {_COLUMNS} FROM schedules{where}{_ORDER} LIMIT ?"
        return [_schedule(r) for r in self._read(sql, [*params, int(limit)])]

    def count_active(self, session: str) -> int:
        rows = self._read(
            f"SELECT COUNT(*) FROM schedules WHERE state <> '{CANCELLED}'{_SESSION}",
            (session, session, session),
        )
        return int(rows[0][0])

    def due(self, now: float, limit: int) -> list[Schedule]:
        sql = (
            f"SELECT {_COLUMNS} FROM schedules WHERE state = '{ACTIVE}' AND next_at <= ?"
            " ORDER BY next_at, id LIMIT ?"
        )
        return [_schedule(r) for r in self._read(sql, (now, int(limit)))]

    def set_state(
        self, schedule_id: str, expect: Sequence[str], state: str, next_at: float | None, now: float
    ) -> bool:
        if not expect:
            return False
        marks = ", ".join("?" for _ in expect)
        return (
            self._write(
                "UPDATE schedules SET state = ?, next_at = ?, updated_at = ? "
                f"WHERE id = ? AND state IN ({marks})",
                (state, next_at, now, schedule_id, *expect),
            )
            > 0
        )

    def advance(
        self,
        schedule_id: str,
        expect_next_at: float,
        next_at: float,
        *,
        fired: int,
        missed: int,
        now: float,
    ) -> bool:
        return (
            self._write(
                "UPDATE schedules SET next_at = ?, fired = fired + ?, missed = missed + ?, "
                "last_fired_at = CASE WHEN ? > 0 THEN ? ELSE last_fired_at END, updated_at = ? "
                f"WHERE id = ? AND state = '{ACTIVE}' AND next_at = ?",
                (next_at, fired, missed, fired, now, now, schedule_id, expect_next_at),
            )
            > 0
        )
