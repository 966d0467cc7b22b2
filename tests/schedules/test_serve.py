"""Recurring schedules through real `reveille serve` processes and the demo model.

"every 2 seconds: ..." (with a test-lowered ``[timers] min_delay_seconds``) fires at its
period, each occurrence one ``scheduled_wakeup`` row of the API session's transcript; `reveille
schedules list` and ``GET /api/schedules`` show it with its next due time; after `reveille
schedules cancel ID` it never fires again; ``DELETE /api/schedules/{id}`` cancels another.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import storage
from delivery.ledger import Ledger
from delivery.schedules import SCHEDULE_KIND, Misfire
from delivery.schedules_engine import ScheduleEngine
from gateway.config import Platform
from gateway.session import SessionSource, build_session_key
from gateway.wake import MISSED_DISPLAY_KIND, WAKEUP_DISPLAY_KIND
from tests.api_server.serve_support import Server, call, chat, ledger_rows, transcript, wait_until

FAST = {"REVEILLE_TIMERS_MIN_DELAY_SECONDS": "1"}
_SCHEDULE_ID = re.compile(r"Schedule (sch_\w+) set")


def _reveille(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reveille.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "REVEILLE_HOME": str(home)},
        timeout=60,
    )


def _fired(home: Path, schedule_id: str) -> list[float]:
    """The instants of the schedule's occurrences that were delivered, in order."""
    rows = [
        r
        for r in ledger_rows(home)
        if r.kind == SCHEDULE_KIND
        and r.id.startswith(schedule_id + "-")
        and r.delivery_state == "delivered"
    ]
    return sorted(r.not_before or 0.0 for r in rows)


def _missed(text: str) -> int:
    """How many more occurrences a wake text says were missed (0: it says none)."""
    found = re.search(r"Missed: (\d+) more occurrence\(s\)", text)
    return int(found.group(1)) if found else 0


def _wakeups(port: int, session_id: str) -> list[dict]:
    return [m for m in transcript(port, session_id) if m["display_kind"] == WAKEUP_DISPLAY_KIND]


def test_a_schedule_fires_at_its_period_until_cancelled(tmp_path: Path) -> None:
    server = Server(tmp_path, extra_env=FAST)
    try:
        session_id, reply = chat(server.port, "every 2 seconds: drink water")
        match = _SCHEDULE_ID.search(reply)
        assert match, reply
        schedule_id = match.group(1)
        wait_until(lambda: len(_fired(tmp_path, schedule_id)) >= 3, timeout=30)
        fired = _fired(tmp_path, schedule_id)
        assert [b - a for a, b in itertools.pairwise(fired)] == [2.0] * (len(fired) - 1)
        wakeups = _wakeups(server.port, session_id)
        assert len(wakeups) >= 3 and all("drink water" in w["content"] for w in wakeups)
        ids = [w["display_metadata"]["delivery_id"] for w in wakeups]
        assert len(set(ids)) == len(ids)  # each occurrence once

        listed = _reveille(tmp_path, "schedules", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        [entry] = [json.loads(line) for line in listed.stdout.splitlines()]
        assert entry["id"] == schedule_id and entry["note"] == "drink water"
        assert entry["state"] == "active" and entry["session"] == session_id
        assert entry["next_due"].endswith(" UTC")
        table = _reveille(tmp_path, "schedules", "list").stdout
        assert table.splitlines()[1].startswith(schedule_id)

        status, _, body = call(server.port, "GET", f"/api/schedules?session={session_id}")
        assert status == 200, body
        [item] = body["data"]
        assert item["id"] == schedule_id and item["every_seconds"] == 2.0
        assert item["next_due_epoch"] > fired[-1]
        status, _, one = call(server.port, "GET", f"/api/schedules/{schedule_id}")
        assert status == 200 and one["state"] == "active"

        cancelled = _reveille(tmp_path, "schedules", "cancel", schedule_id)
        assert cancelled.returncode == 0 and "cancelled" in cancelled.stdout, cancelled
        after_cancel = len(_fired(tmp_path, schedule_id))
        pending = [
            r
            for r in ledger_rows(tmp_path)
            if r.id.startswith(schedule_id + "-") and r.delivery_state == "pending"
        ]
        assert all(r.not_before is not None and r.not_before <= time.time() for r in pending)
        time.sleep(6)  # three periods: nothing more may fire
        assert len(_fired(tmp_path, schedule_id)) <= after_cancel + len(pending)
        assert _reveille(tmp_path, "schedules", "list", "--json").stdout == ""
        everything = _reveille(tmp_path, "schedules", "list", "--all").stdout
        assert schedule_id in everything and "cancelled" in everything and "fired" in everything

        _, second = chat(server.port, "every 600 seconds: stand up", session_id=session_id)
        other_id = _SCHEDULE_ID.search(second).group(1)  # type: ignore[union-attr]
        status, _, gone = call(server.port, "DELETE", f"/api/schedules/{other_id}")
        assert status == 200 and gone["state"] == "cancelled", gone
        status, _, missing = call(server.port, "DELETE", "/api/schedules/sch_nope")
        assert status == 404 and missing["error"]["code"] == "schedule_not_found"
        status, _, unkeyed = call(
            server.port, "GET", "/api/schedules", headers={"Authorization": "Bearer wrong"}
        )
        assert status == 401, unkeyed
    finally:
        assert server.stop() == 0


def test_after_an_outage_fire_once_says_how_many_were_missed_and_skip_shows_missed(
    tmp_path: Path,
) -> None:
    server = Server(tmp_path, extra_env=FAST)
    session_id, _ = chat(server.port, "hello")
    location = storage.sqlite_files(ledger=tmp_path / "ledger.db")
    ledger = Ledger(location.open_ledger())
    engine = ScheduleEngine(ledger, location.open_schedules())
    origin = {
        "session_key": build_session_key(SessionSource(Platform.API_SERVER, chat_id=session_id)),
        "origin_session_id": session_id,
    }
    server.stop(signal.SIGKILL)  # the outage starts before the first occurrence
    engine.create(note="collapse me", every_seconds=2, **origin)
    engine.create(note="skip me", every_seconds=2, misfire=Misfire("skip"), **origin)
    engine.store.close()
    ledger.close()
    time.sleep(7)  # three periods and more pass while no server runs

    again = Server(tmp_path, extra_env=FAST)
    try:

        def first(note: str) -> dict | None:
            rows = [m for m in transcript(again.port, session_id) if note in m["content"]]
            return rows[0] if rows else None

        wait_until(lambda: first("collapse me") and first("skip me"), timeout=30)
        fired, missed = first("collapse me"), first("skip me")
        assert fired is not None and missed is not None
        assert fired["display_kind"] == WAKEUP_DISPLAY_KIND
        assert _missed(fired["content"]) >= 2, fired
        assert missed["display_kind"] == MISSED_DISPLAY_KIND
        assert "[Missed occurrence]" in missed["content"]
        assert _missed(missed["content"]) >= 2, missed
    finally:
        again.stop()
