"""The DST soak: 30 virtual days across a spring-forward (then, separately, a fall-back) in
Europe/Berlin and America/New_York, two server processes racing for every firing, one of
them SIGKILLed inside a step and started again later. No sleeping: the clock is virtual,
and the test passes each step's time to both processes (``soak_worker.py``).

Every occurrence fires exactly once, at the instant an independent oracle (a walk over every
UTC minute, ``daily_oracle``) says: a wall time that does not exist at the end of the gap, a
repeated one at its first occurrence, nothing twice, nothing missing; and an outage of both
servers inside the run is handled by each schedule's misfire policy.
"""

from __future__ import annotations

import datetime as dt
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

import storage
from delivery.ledger import Ledger
from delivery.rows import RowQuery
from delivery.schedules import SCHEDULE_KIND, occurrence_id, parse_misfire
from delivery.schedules_engine import ScheduleEngine
from tests.schedules._support import daily_oracle, utc

WORKER = Path(__file__).with_name("soak_worker.py")
DAYS = 30
# (zone, cron, hour, minute, sundays only): 02:30 falls in both spring gaps and Berlin's
# repeated hour, 01:30 in New York's; 02:45 on Sundays only is on every transition day.
SPECS = [
    (zone, cron, hour, minute, sunday, misfire)
    for zone in ("Europe/Berlin", "America/New_York")
    for cron, hour, minute, sunday, misfire in (
        ("30 2 * * *", 2, 30, False, "fire_once"),
        ("30 1 * * *", 1, 30, False, "fire_once"),
        ("45 2 * * 0", 2, 45, True, "fire_once"),
        ("30 2 * * *", 2, 30, False, "skip"),
    )
]
# An outage of both servers from day 10 to day 12 noon (UTC): the occurrences inside it are
# missed, each schedule's first one fired late (fire_once, saying how many more were missed)
# or shown as missed (skip), the others never written.
OUTAGE = (10 * 86400.0, 12.5 * 86400.0)


class Worker:
    def __init__(self, ledger_path: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), str(ledger_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.acks: list[str] = []
        assert self._line() == "READY"

    def _line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def send(self, t: float) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"step {t!r}\n")
        self.proc.stdin.flush()

    def finish(self) -> None:
        while (line := self._line()) != "DONE":
            assert line.startswith("ACK "), line
            self.acks.append(line.split()[1])

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        out, _ = self.proc.communicate()
        self.acks += [line.split()[1] for line in out.splitlines() if line.startswith("ACK ")]

    def quit(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("quit\n")
        self.proc.stdin.flush()
        self.proc.wait(timeout=30)


def _expected(zone: str, hour: int, minute: int, sunday: bool, start: float, end: float):
    instants = daily_oracle(zone, hour, minute, start, end)
    if sunday:
        tz = ZoneInfo(zone)
        instants = [t for t in instants if dt.datetime.fromtimestamp(t, tz).weekday() == 6]
    return instants


@pytest.mark.parametrize("start", [utc(2026, 3, 5), utc(2026, 10, 20)], ids=["spring", "fall"])
def test_every_occurrence_fires_exactly_once_across_dst_a_race_and_a_sigkill(
    tmp_path: Path, start: float
) -> None:
    path = tmp_path / "ledger.db"
    end = start + DAYS * 86400
    location = storage.sqlite_files(ledger=path)
    ledger = Ledger(location.open_ledger(), clock=lambda: start, monotonic=lambda: start)
    engine = ScheduleEngine(ledger, location.open_schedules())
    made = {
        engine.create(
            note=f"{zone} {cron} {misfire}",
            cron=cron,
            zone=zone,
            misfire=parse_misfire(misfire),
            session_key="k",
        ).id: (_expected(zone, hour, minute, sunday, start, end), misfire)
        for zone, cron, hour, minute, sunday, misfire in SPECS
    }
    engine.store.close()
    ledger.close()

    down, up = start + OUTAGE[0], start + OUTAGE[1]
    expected: dict[str, tuple[str, int]] = {}  # occurrence id -> (status, missed with it)
    for sid, (instants, misfire) in made.items():
        lost = [t for t in instants if down < t <= up]
        for t in instants:
            if not down < t <= up:
                expected[occurrence_id(sid, t)] = ("completed", 0)
        if lost:
            status = "completed" if misfire == "fire_once" else "missed"
            expected[occurrence_id(sid, lost[0])] = (status, len(lost) - 1)
    steps = sorted({t for instants, _ in made.values() for t in instants if not down < t <= up})
    steps = sorted([*steps, up])
    assert len(steps) > 100
    killed_at, restarted_at = len(steps) // 4, 2 * len(steps) // 3
    workers = [Worker(path), Worker(path)]
    dead: list[Worker] = []
    for i, t in enumerate(steps):
        if i == restarted_at:
            workers.append(Worker(path))
        for worker in workers:
            worker.send(t)  # both race for the same firings
        if i == killed_at:
            victim = workers.pop(0)
            victim.kill()  # SIGKILL inside its run of this step
            dead.append(victim)
        for worker in workers:
            worker.finish()
    for worker in workers:
        worker.send(end)
        worker.finish()
        worker.quit()

    acks = Counter(row_id for w in workers + dead for row_id in w.acks)
    assert [row_id for row_id, n in acks.items() if n > 1] == []  # nothing twice
    ledger = Ledger(location.open_ledger(), clock=lambda: end)
    rows = ledger.query(RowQuery(kind=SCHEDULE_KIND, limit=10_000))
    delivered = {
        r.id: (str(r.event["status"]), int(r.event["missed"]))
        for r in rows
        if r.delivery_state == "delivered" and r.event is not None
    }
    # Nothing missing, nothing extra, each at its instant and by its policy.
    assert delivered == expected
    assert set(acks) <= set(delivered)
    store = location.open_schedules()
    for sid, (instants, misfire) in made.items():
        schedule = store.get(sid)
        assert schedule is not None
        lost = sum(1 for t in instants if down < t <= up)
        ran = len(instants) - lost + (1 if lost and misfire == "fire_once" else 0)
        assert (schedule.fired, schedule.fired + schedule.missed) == (ran, len(instants))
    store.close()
    ledger.close()
