"""Shared pieces of the schedule tests: stores opened as the program opens them, a clock the
test moves, and an independent oracle of when a daily cron fires across DST."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from zoneinfo import ZoneInfo

import storage
from delivery.ledger import Ledger
from delivery.schedules_backend import ScheduleBackend
from delivery.schedules_engine import ScheduleEngine
from tests.delivery._support import FakeClock

BACKENDS = ("sqlite", "memory", "postgres")


@dataclass
class Stores:
    ledger: Ledger
    schedules: ScheduleBackend
    engine: ScheduleEngine
    clock: FakeClock

    def close(self) -> None:
        self.schedules.close()
        self.ledger.close()


def open_stores(kind: str, directory: Path, clock: FakeClock) -> Stores:
    if kind == "sqlite":
        location = storage.sqlite_files(ledger=directory / "ledger.db")
    elif kind == "memory":
        location = storage.open_storage("memory://schedules")
    else:
        from tests.pg_support import fresh_url

        location = storage.open_storage(fresh_url())
    ledger = Ledger(location.open_ledger(), clock=clock, monotonic=clock.monotonic)
    schedules = location.open_schedules()
    return Stores(ledger, schedules, ScheduleEngine(ledger, schedules), clock)


def utc(*args: int) -> float:
    return dt.datetime(*args, tzinfo=dt.UTC).timestamp()  # type: ignore[misc]


def daily_oracle(zone: str, hour: int, minute: int, start: float, end: float) -> list[float]:
    """When a daily ``minute hour * * *`` fires in ``zone`` between ``start`` and ``end``,
    found by walking every UTC minute (no wall-time arithmetic): the first instant whose
    wall time is hour:minute, or, on a day whose wall clock skips it, the first instant
    after the skip (the end of the gap)."""
    tz = ZoneInfo(zone)
    out: list[float] = []
    day_first: dict[dt.date, float] = {}
    t = start - start % 60
    previous: dt.datetime | None = None
    while t <= end:
        wall = dt.datetime.fromtimestamp(t, tz).replace(tzinfo=None)
        target = wall.replace(hour=hour, minute=minute, second=0)
        reached = wall >= target and (previous is None or previous < target)
        if reached and wall.date() not in day_first and t > start:
            day_first[wall.date()] = t
            out.append(t)
        previous = wall
        t += 60
    return out
