"""Recurring schedules: what one is (``Schedule``), when it fires (``next_instant``) and what
a late firing becomes (``decide``). Pure rules, no store: ``delivery.schedules_engine`` puts
them on the ledger, ``delivery.schedules_backend`` says how a store keeps them.

A schedule is a cron expression in an IANA zone, or an interval of seconds from an anchor.
Its occurrences are instants (UTC epoch seconds), and an occurrence's identity is its
instant: ``occurrence_id`` names the ledger row that fires it, so no replay, second server
or restored backup can fire one twice (the row's id is unique).

Wall times and daylight saving time: cron matches wall times, and a wall time is mapped to
one instant. One that does not exist (the clocks jumped over it) fires once, at the end of
the gap; one that repeats fires once, at its first occurrence. Several wall times that map
to one instant (every 15 minutes across a one-hour gap) fire once.

Missed occurrences (the server was down): ``Misfire`` says what a late occurrence does.
``fire_once`` (the default) fires it once, saying how many more were missed; ``skip`` turns
it into a visible ``missed`` event; ``fire_if_within D`` fires when late by less than D, else
as ``skip``. An occurrence is late when it is looked at more than ``GRACE_SECONDS`` after its
instant (or half its period, when that is shorter).
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Final, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

__all__ = [
    "ACTIVE",
    "CANCELLED",
    "GRACE_SECONDS",
    "MISFIRE_POLICIES",
    "PAUSED",
    "SCHEDULE_KIND",
    "STATES",
    "TARGETS",
    "Firing",
    "Misfire",
    "Origin",
    "Schedule",
    "ScheduleError",
    "decide",
    "instants_between",
    "next_instant",
    "occurrence_id",
    "parse_duration",
    "parse_misfire",
]

SCHEDULE_KIND: Final = "schedule"
"""The ledger ``kind`` of an occurrence's row (a one-shot reminder's is ``timer``)."""

ACTIVE: Final = "active"
PAUSED: Final = "paused"
CANCELLED: Final = "cancelled"
STATES: Final = (ACTIVE, PAUSED, CANCELLED)

MisfirePolicy = Literal["fire_once", "skip", "fire_if_within"]
MISFIRE_POLICIES: Final[tuple[MisfirePolicy, ...]] = ("fire_once", "skip", "fire_if_within")
Target = Literal["this", "own"]
TARGETS: Final[tuple[Target, ...]] = ("this", "own")

GRACE_SECONDS: Final = 30.0
"""An occurrence looked at later than this after its instant was missed (the server was
down or stopped), not merely a little late."""

# Counting missed occurrences is bounded: an outage of years on a minutely schedule is
# reported as "at least" this many instead of walking every minute.
_MAX_COUNT = 10_000
_MAX_STEPS = 10_000  # wall times tried before an expression is declared never to fire


@dataclass(frozen=True, slots=True)
class Origin:
    """The conversation a schedule's occurrences come home to, as the ledger routes them."""

    session_key: str | None
    origin_session_id: str | None
    origin_ui_session_id: str | None


class ScheduleError(ValueError):
    """A schedule that cannot be made as asked; the message says what to give instead."""


@dataclass(frozen=True, slots=True)
class Misfire:
    """What a late occurrence does (see the module docstring)."""

    policy: MisfirePolicy = "fire_once"
    within_seconds: float | None = None

    def describe(self) -> str:
        if self.policy == "fire_if_within" and self.within_seconds is not None:
            return f"fire_if_within {self.within_seconds:g}s"
        return self.policy


@dataclass(frozen=True, slots=True)
class Schedule:
    """One recurring schedule as the store keeps it.

    ``cron`` + ``zone``, or ``every_seconds`` counted from ``anchor``. ``next_at``: the
    instant of the occurrence that is to come (its ledger row exists, or is written by the
    next pass); None once cancelled. ``session_key`` and the origin ids route its firings
    like any result of the conversation that made it."""

    id: str
    note: str
    cron: str | None
    zone: str
    every_seconds: float | None
    anchor: float
    misfire: Misfire
    target: Target
    state: str
    session_key: str | None
    origin_session_id: str | None
    origin_ui_session_id: str | None
    created_at: float
    updated_at: float
    next_at: float | None
    fired: int = 0
    missed: int = 0
    last_fired_at: float | None = None

    @property
    def session(self) -> str | None:
        """The conversation it belongs to, as people name it."""
        return self.origin_ui_session_id or self.origin_session_id or self.session_key

    def describe_spec(self) -> str:
        if self.cron is not None:
            return f"cron {self.cron!r} ({self.zone})"
        return f"every {self.every_seconds:g} s"

    def with_state(self, state: str, next_at: float | None, now: float) -> Schedule:
        return replace(self, state=state, next_at=next_at, updated_at=now)


def occurrence_id(schedule_id: str, instant: float) -> str:
    """The ledger id of the occurrence at ``instant``: unique per (schedule, instant)."""
    when = dt.datetime.fromtimestamp(round(instant), dt.UTC)
    return f"{schedule_id}-{when:%Y%m%dT%H%M%SZ}"


def zone_of(name: str) -> ZoneInfo:
    if not isinstance(name, str) or not name.strip():
        raise ScheduleError("tz must name an IANA time zone, e.g. Europe/Berlin")
    try:
        return ZoneInfo(name.strip())
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(
            f"unknown time zone {name[:64]!r}: give an IANA name such as Europe/Berlin, "
            "America/New_York or UTC"
        ) from None


def check_cron(expr: str) -> str:
    """The expression, normalized, or ScheduleError naming what is wrong with it."""
    if not isinstance(expr, str) or not expr.strip():
        raise ScheduleError("cron must be an expression such as '0 9 * * 1-5'")
    expr = " ".join(expr.split())
    if len(expr) > 200:
        raise ScheduleError("cron is too long (at most 200 characters)")
    try:
        CronSim(expr, dt.datetime(2000, 1, 1))
    except CronSimError as exc:
        raise ScheduleError(f"bad cron expression {expr!r}: {exc}") from None
    return expr


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: object) -> float:
    """Seconds of ``90``, ``"90s"``, ``"15m"``, ``"2h"`` or ``"1d"``."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        seconds = float(text)
    else:
        match = _DURATION.match(str(text).lower()) if isinstance(text, str) else None
        if match is None:
            raise ScheduleError(f"{str(text)[:32]!r} is no duration: give e.g. 90s, 15m, 2h, 1d")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if not math.isfinite(seconds) or seconds <= 0:
        raise ScheduleError("a duration must be a positive number of seconds")
    return seconds


def parse_misfire(text: object) -> Misfire:
    """``fire_once`` (also for None), ``skip`` or ``fire_if_within <duration>``."""
    if text is None:
        return Misfire()
    if not isinstance(text, str):
        raise ScheduleError("misfire must be fire_once, skip or 'fire_if_within <duration>'")
    words = text.replace("=", " ").split()
    if words == ["fire_once"]:
        return Misfire("fire_once")
    if words == ["skip"]:
        return Misfire("skip")
    if len(words) == 2 and words[0] == "fire_if_within":
        return Misfire("fire_if_within", parse_duration(words[1]))
    raise ScheduleError(
        f"misfire {text[:64]!r} is not one of fire_once, skip, 'fire_if_within <duration>'"
    )


# -- wall times to instants ------------------------------------------------------------------


def _exists(wall: dt.datetime, zone: ZoneInfo) -> bool:
    aware = wall.replace(tzinfo=zone)
    back = aware.astimezone(dt.UTC).astimezone(zone).replace(tzinfo=None)
    return back == wall


def wall_to_instant(wall: dt.datetime, zone: ZoneInfo) -> float:
    """The instant a naive wall time of ``zone`` fires at: its first occurrence when it
    repeats (fold 0), the end of the gap when it does not exist."""
    if _exists(wall, zone):
        return wall.replace(tzinfo=zone, fold=0).timestamp()
    # In a gap: fold=1 reads it with the offset after the jump (an instant before the
    # gap's end), fold=0 with the offset before (after it). The gap's end lies between:
    # the first second whose offset is the one after the jump.
    lo = int(wall.replace(tzinfo=zone, fold=1).timestamp())
    hi = math.ceil(wall.replace(tzinfo=zone, fold=0).timestamp())
    after = dt.datetime.fromtimestamp(hi, zone).utcoffset()
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if dt.datetime.fromtimestamp(mid, zone).utcoffset() == after:
            hi = mid
        else:
            lo = mid
    return float(hi)


def _cron_instants(schedule: Schedule, after: float) -> Iterator[float]:
    """The cron schedule's occurrences after ``after``, in order, each once."""
    assert schedule.cron is not None
    zone = zone_of(schedule.zone)
    # Start one second back so a wall time equal to ``after``'s is tried, then keep those
    # whose instant is later: in a repeated hour, the wall times of its first pass map
    # before ``after`` and are passed over (they fired, at their first occurrence). Wall
    # times inside one gap map to one instant, yielded once.
    start = dt.datetime.fromtimestamp(math.floor(after) - 1, zone).replace(tzinfo=None, fold=0)
    last, idle = after, 0
    for wall in CronSim(schedule.cron, start):
        instant = wall_to_instant(wall, zone)
        if instant > last:
            last, idle = instant, 0
            yield instant
        else:
            idle += 1
            if idle > _MAX_STEPS:
                break
    raise ScheduleError(f"cron {schedule.cron!r} has no occurrence after {after:.0f}")


def next_instant(schedule: Schedule, after: float) -> float:
    """The first occurrence strictly after ``after`` (epoch seconds)."""
    if schedule.every_seconds is not None:
        period = schedule.every_seconds
        steps = math.floor((after - schedule.anchor) / period) + 1
        instant = schedule.anchor + max(steps, 1) * period
        while instant <= after:  # float rounding
            instant += period
        return instant
    return next(_cron_instants(schedule, after))


def instants_between(schedule: Schedule, after: float, until: float) -> tuple[int, float]:
    """How many occurrences lie in (``after``, ``until``] (counted up to ``_MAX_COUNT``, then
    skipped over), and the first one after ``until``."""
    if schedule.every_seconds is not None:
        instant = next_instant(schedule, after)
        count = 0 if instant > until else math.floor((until - instant) / schedule.every_seconds) + 1
        return count, next_instant(schedule, max(until, after))
    for count, instant in enumerate(_cron_instants(schedule, after)):
        if instant > until:
            return count, instant
        if count + 1 >= _MAX_COUNT:
            return count + 1, next_instant(schedule, until)
    raise AssertionError("unreachable: _cron_instants raises when it ends")


@dataclass(frozen=True, slots=True)
class Firing:
    """What the occurrence at ``instant`` does when looked at: ``runs`` (False: a visible
    ``missed`` event instead), how many more occurrences were ``missed`` with it, and the
    occurrence that comes next."""

    instant: float
    runs: bool
    missed: int
    next_at: float
    late_seconds: float


def decide(schedule: Schedule, instant: float, now: float) -> Firing:
    """The misfire policy applied to the occurrence at ``instant``, looked at ``now``."""
    missed, next_at = instants_between(schedule, instant, now)
    late = max(now - instant, 0.0)
    policy = schedule.misfire
    # Late is later than the grace, or than half the period for a short one: an occurrence
    # looked at when the next is nearer than it is was missed.
    grace = min(GRACE_SECONDS, (next_instant(schedule, instant) - instant) / 2)
    if late <= grace or policy.policy == "fire_once":
        runs = True
    elif policy.policy == "fire_if_within":
        runs = policy.within_seconds is not None and late < policy.within_seconds
    else:
        runs = False
    return Firing(instant, runs, missed, next_at, late)
