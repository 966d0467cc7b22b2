"""How a store keeps recurring schedules (``delivery.schedules``); ``storage.sqlite``,
``storage.postgres`` and ``storage.memory`` implement it, beside the ledger.

The store holds the schedule itself (its spec, policy, state and the instant of the
occurrence to come); the occurrences are ledger rows (``delivery.schedules_engine``). Every
write that two servers may race for is a compare-and-set on the row's ``state`` or
``next_at``, so exactly one of them wins.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from delivery.schedules import Schedule

__all__ = ["ScheduleBackend"]


@runtime_checkable
class ScheduleBackend(Protocol):
    def add(self, schedule: Schedule) -> None:
        """Insert a new schedule (its id is new)."""

    def get(self, schedule_id: str) -> Schedule | None: ...

    def find(
        self, *, session: str | None = None, states: Sequence[str] | None = None, limit: int = 100
    ) -> list[Schedule]:
        """Schedules of ``session`` (a routing key or either origin id), in ``states``,
        earliest next occurrence first (cancelled ones last)."""

    def count_active(self, session: str) -> int:
        """Schedules of ``session`` that are active or paused."""

    def due(self, now: float, limit: int) -> list[Schedule]:
        """Active schedules whose ``next_at`` has come, earliest first."""

    def set_state(
        self, schedule_id: str, expect: Sequence[str], state: str, next_at: float | None, now: float
    ) -> bool:
        """Move to ``state`` (with ``next_at``) only from one of ``expect``."""

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
        """The occurrence at ``expect_next_at`` was handled: ``next_at`` comes next, and the
        counters grow by ``fired`` and ``missed``. Only while active and still at
        ``expect_next_at`` (one server wins)."""

    def close(self) -> None: ...
