"""When a schedule fires (``delivery.schedules``): cron in a zone across DST, intervals, the
misfire policies, and the errors a bad spec gets."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest

from delivery.schedules import (
    GRACE_SECONDS,
    Misfire,
    Schedule,
    ScheduleError,
    check_cron,
    decide,
    instants_between,
    next_instant,
    occurrence_id,
    parse_duration,
    parse_misfire,
    zone_of,
)
from tests.schedules._support import daily_oracle, utc


def cron(expr: str, zone: str, misfire: Misfire | None = None) -> Schedule:
    return Schedule(
        "sch_x", "n", expr, zone, None, 0.0, misfire or Misfire(), "this", "active",
        None, None, None, 0.0, 0.0, None,
    )  # fmt: skip


def every(seconds: float, anchor: float, misfire: Misfire | None = None) -> Schedule:
    return Schedule(
        "sch_y", "n", None, "UTC", seconds, anchor, misfire or Misfire(), "this", "active",
        None, None, None, 0.0, 0.0, None,
    )  # fmt: skip


def walk(schedule: Schedule, start: float, end: float) -> list[float]:
    out, t = [], start
    while (t := next_instant(schedule, t)) <= end:
        out.append(t)
    return out


def local(t: float, zone: str) -> str:
    return dt.datetime.fromtimestamp(t, ZoneInfo(zone)).strftime("%m-%d %H:%M%z")


@pytest.mark.parametrize(
    ("zone", "gap_day"), [("Europe/Berlin", "03-29"), ("America/New_York", "03-08")]
)
def test_a_wall_time_that_does_not_exist_fires_once_at_the_end_of_the_gap(
    zone: str, gap_day: str
) -> None:
    fired = walk(cron("30 2 * * *", zone), utc(2026, 3, 1), utc(2026, 3, 31))
    on_gap_day = [local(t, zone) for t in fired if local(t, zone).startswith(gap_day)]
    assert on_gap_day == [f"{gap_day} 03:00{'+0200' if 'Berlin' in zone else '-0400'}"]
    assert fired == daily_oracle(zone, 2, 30, utc(2026, 3, 1), utc(2026, 3, 31))


@pytest.mark.parametrize(
    ("zone", "hour", "day"),
    [("Europe/Berlin", 2, "10-25"), ("America/New_York", 1, "11-01")],
)
def test_a_wall_time_that_repeats_fires_once_at_its_first_occurrence(
    zone: str, hour: int, day: str
) -> None:
    fired = walk(cron(f"30 {hour} * * *", zone), utc(2026, 10, 15), utc(2026, 11, 15))
    that_day = [local(t, zone) for t in fired if local(t, zone).startswith(day)]
    summer = "+0200" if "Berlin" in zone else "-0400"
    assert that_day == [f"{day} {hour:02d}:30{summer}"]
    assert fired == daily_oracle(zone, hour, 30, utc(2026, 10, 15), utc(2026, 11, 15))


def test_wall_times_inside_one_gap_fire_once_together() -> None:
    zone = "Europe/Berlin"
    fired = walk(cron("*/15 2-3 * * *", zone), utc(2026, 3, 28, 23), utc(2026, 3, 29, 3))
    assert [local(t, zone) for t in fired] == [
        "03-29 03:00+0200",  # 02:00, 02:15, 02:30, 02:45 and 03:00 itself: one instant
        "03-29 03:15+0200",
        "03-29 03:30+0200",
        "03-29 03:45+0200",
    ]


def test_an_hourly_cron_skips_no_hour_and_repeats_none_in_the_fall() -> None:
    zone = "America/New_York"
    fired = walk(cron("0 * * * *", zone), utc(2026, 11, 1, 3), utc(2026, 11, 1, 9))
    assert [local(t, zone) for t in fired] == [
        "11-01 00:00-0400",
        "11-01 01:00-0400",  # 01:00 repeats: fired at its first occurrence only
        "11-01 02:00-0500",
        "11-01 03:00-0500",
        "11-01 04:00-0500",
    ]


def test_an_interval_counts_from_its_anchor() -> None:
    s = every(10, 1000.0)
    assert next_instant(s, 1000.0) == 1010.0
    assert next_instant(s, 1015.5) == 1020.0
    assert instants_between(s, 1010.0, 1055.0) == (4, 1060.0)


def test_an_occurrence_is_named_by_its_instant() -> None:
    assert occurrence_id("sch_a", utc(2026, 3, 29, 1)) == "sch_a-20260329T010000Z"
    at = utc(2026, 3, 29, 1)
    assert occurrence_id("sch_a", at) != occurrence_id("sch_b", at)


def test_fire_once_collapses_an_outage_and_says_how_many_were_missed() -> None:
    s = every(60, 0.0)
    firing = decide(s, 600.0, 600.0 + 10 * 60 + 5)
    assert firing.runs and firing.missed == 10 and firing.next_at == 1260.0


def test_skip_turns_a_late_occurrence_into_a_missed_one() -> None:
    s = every(3600, 0.0, Misfire("skip"))
    assert decide(s, 3600.0, 3600.0 + GRACE_SECONDS).runs  # on time: runs
    late = decide(s, 3600.0, 3600.0 + 2 * 3600 + 1)
    assert not late.runs and late.missed == 2 and late.next_at == 4 * 3600.0


def test_fire_if_within_runs_when_late_by_less_than_its_duration() -> None:
    s = every(3600, 0.0, Misfire("fire_if_within", 600.0))
    assert decide(s, 3600.0, 3600.0 + 599).runs
    assert not decide(s, 3600.0, 3600.0 + 601).runs


def test_parsing_misfire_and_durations() -> None:
    assert parse_misfire(None) == Misfire("fire_once")
    assert parse_misfire("skip") == Misfire("skip")
    assert parse_misfire("fire_if_within 15m") == Misfire("fire_if_within", 900.0)
    assert parse_misfire("fire_if_within=2h") == Misfire("fire_if_within", 7200.0)
    assert parse_duration(90) == 90.0 and parse_duration("1d") == 86400.0
    for bad in ("sometimes", "fire_if_within", "fire_if_within soon", 3):
        with pytest.raises(ScheduleError):
            parse_misfire(bad)


def test_bad_cron_and_unknown_zones_get_clear_errors() -> None:
    assert check_cron(" 0  9 * * 1-5 ") == "0 9 * * 1-5"
    with pytest.raises(ScheduleError, match="bad cron expression"):
        check_cron("61 * * * *")
    with pytest.raises(ScheduleError, match="unknown time zone"):
        zone_of("Mars/Olympus_Mons")
    with pytest.raises(ScheduleError, match="bad cron expression"):
        check_cron("0 0 30 2 *")  # never fires


def test_a_long_outage_of_a_minutely_cron_is_counted_without_walking_forever() -> None:
    s = cron("* * * * *", "Europe/Berlin")
    start = utc(2026, 1, 1)
    count, nxt = instants_between(s, start, start + 365 * 86400)
    assert count == 10_000  # counted up to the cap, then skipped over
    assert nxt == start + 365 * 86400 + 60
    assert instants_between(s, start, start + 3600) == (60, start + 3660)
