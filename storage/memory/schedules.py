"""The schedules store in this process's memory (``delivery.schedules_backend``): for tests
and embedding. One lock makes each compare-and-set as atomic as a SQL transaction."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from delivery.schedules import ACTIVE, CANCELLED, PAUSED, Schedule

if TYPE_CHECKING:
    from delivery.schedules_backend import ScheduleBackend

__all__ = ["MemorySchedules"]

_RANK = {ACTIVE: 0, PAUSED: 1}


def _of(schedule: Schedule, session: str) -> bool:
    return session in (
        schedule.session_key,
        schedule.origin_session_id,
        schedule.origin_ui_session_id,
    )


class MemorySchedules:
    """``ScheduleBackend`` in memory (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[str, Schedule] = {}

    def add(self, schedule: Schedule) -> None:
        with self._lock:
            if schedule.id in self._rows:
                raise ValueError(f"schedule {schedule.id} exists")
            self._rows[schedule.id] = schedule

    def get(self, schedule_id: str) -> Schedule | None:
        with self._lock:
            return self._rows.get(schedule_id)

    def find(
        self, *, session: str | None = None, states: Sequence[str] | None = None, limit: int = 100
    ) -> list[Schedule]:
        with self._lock:
            rows = [
                s
                for s in self._rows.values()
                if (session is None or _of(s, session)) and (states is None or s.state in states)
            ]
        rows.sort(
            key=lambda s: (
                _RANK.get(s.state, 2),
                s.next_at is not None,  # SQL sorts NULL first
                s.next_at or 0.0,
                s.created_at,
                s.id,
            )
        )
        return rows[:limit]

    def count_active(self, session: str) -> int:
        with self._lock:
            return sum(1 for s in self._rows.values() if s.state != CANCELLED and _of(s, session))

    def due(self, now: float, limit: int) -> list[Schedule]:
        with self._lock:
            rows = [
                s
                for s in self._rows.values()
                if s.state == ACTIVE and s.next_at is not None and s.next_at <= now
            ]
        rows.sort(key=lambda s: (s.next_at or 0.0, s.id))
        return rows[:limit]

    def set_state(
        self, schedule_id: str, expect: Sequence[str], state: str, next_at: float | None, now: float
    ) -> bool:
        with self._lock:
            row = self._rows.get(schedule_id)
            if row is None or row.state not in expect:
                return False
            self._rows[schedule_id] = row.with_state(state, next_at, now)
            return True

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
        with self._lock:
            row = self._rows.get(schedule_id)
            if row is None or row.state != ACTIVE or row.next_at != expect_next_at:
                return False
            self._rows[schedule_id] = dataclasses.replace(
                row,
                next_at=next_at,
                fired=row.fired + fired,
                missed=row.missed + missed,
                last_fired_at=now if fired else row.last_fired_at,
                updated_at=now,
            )
            return True

    def close(self) -> None:
        pass


if TYPE_CHECKING:
    _conforms: type[ScheduleBackend] = MemorySchedules
