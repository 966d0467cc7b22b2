"""`reveille schedules list [--all] | cancel | pause | resume` on a state directory: each line
starts with its id and shows the note, the next due time in the schedule's zone and the
conversation; one-shot reminders are listed and cancelled too; unknown ids are errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import storage
from delivery.events import SCHEDULED_WAKEUP, TIMER_KIND
from delivery.ledger import Ledger
from delivery.schedules_engine import ScheduleEngine


def _reveille(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reveille.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "REVEILLE_HOME": str(home)},
        timeout=60,
    )


def _listed(home: Path, *flags: str) -> list[dict[str, str]]:
    out = _reveille(home, "schedules", "list", "--json", *flags)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_list_pause_resume_cancel(tmp_path: Path) -> None:
    location = storage.sqlite_files(ledger=tmp_path / "ledger.db")
    ledger = Ledger(location.open_ledger())
    engine = ScheduleEngine(ledger, location.open_schedules())
    berlin = engine.create(
        note="overnight alerts", cron="0 9 * * 1-5", zone="Europe/Berlin", session_key="s1"
    )
    every = engine.create(note="stretch", every_seconds=600, origin_session_id="api-7")
    due = time.time() + 3600
    ledger.schedule(
        "tmr_one",
        kind=TIMER_KIND,
        event={"type": SCHEDULED_WAKEUP, "delivery_id": "tmr_one", "note": "tea", "zone": "UTC"},
        not_before=due,
        origin_session_id="api-7",
        goal="tea",
    )
    engine.store.close()
    ledger.close()

    listed = _listed(tmp_path)
    # Schedules first (soonest first), then the reminders.
    assert {e["id"] for e in listed[:2]} == {berlin.id, every.id} and listed[2]["id"] == "tmr_one"
    by_id = {e["id"]: e for e in listed}
    assert by_id[berlin.id]["next_due"].endswith(("+01:00 Europe/Berlin", "+02:00 Europe/Berlin"))
    assert by_id[berlin.id]["session"] == "s1" and by_id[berlin.id]["note"] == "overnight alerts"
    assert by_id["tmr_one"]["kind"] == "reminder" and by_id["tmr_one"]["state"] == "scheduled"
    assert by_id[every.id]["session"] == "api-7"
    table = _reveille(tmp_path, "schedules", "list").stdout.splitlines()
    assert table[0].startswith("ID") and all(
        line.startswith((berlin.id, every.id, "tmr_one")) for line in table[1:]
    )

    paused = _reveille(tmp_path, "schedules", "pause", berlin.id)
    assert paused.returncode == 0 and f"{berlin.id}: paused" in paused.stdout
    assert {e["id"]: e["state"] for e in _listed(tmp_path)}[berlin.id] == "paused"
    resumed = _reveille(tmp_path, "schedules", "resume", berlin.id)
    assert resumed.returncode == 0 and "active; next at" in resumed.stdout, resumed
    for row_id in (every.id, "tmr_one"):
        gone = _reveille(tmp_path, "schedules", "cancel", row_id)
        assert gone.returncode == 0 and "cancelled" in gone.stdout, gone
    assert [e["id"] for e in _listed(tmp_path)] == [berlin.id]
    everything = {e["id"]: e["state"] for e in _listed(tmp_path, "--all")}
    assert everything[every.id] == "cancelled" and everything["tmr_one"] == "cancelled"

    for action in ("cancel", "pause", "resume"):
        unknown = _reveille(tmp_path, "schedules", action, "sch_nope")
        assert unknown.returncode == 1 and "no schedule" in unknown.stderr
    assert _reveille(tmp_path, "schedules", "cancel", "tmr_nope").returncode == 1
