"""Reminders (`schedule_wakeup`) through real `reveille serve` processes and the demo model.

- "remind me in 3 seconds: ..." with the server SIGKILLed at 1 s and started again: exactly
  one ``scheduled_wakeup`` row in the transcript, restating the note, folded into the next
  turn once.
- Two servers on one state directory: the reminder fires once.
- `reveille background list` and ``GET /api/background`` show the pending reminder with its
  due time; `reveille background cancel ID` cancels it, and it never fires.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from gateway.wake import WAKEUP_DISPLAY_KIND
from tests.api_server.serve_support import (
    Server,
    call,
    chat,
    ledger_rows,
    transcript,
    wait_until,
)

# The proof sets a 3 s reminder; the default floor is 10 s.
FAST = {"REVEILLE_TIMERS_MIN_DELAY_SECONDS": "1"}
_WAKEUP_ID = re.compile(r"\(id (tmr_\w+)\)")


def _wakeups(port: int, session_id: str) -> list[dict]:
    return [m for m in transcript(port, session_id) if m["display_kind"] == WAKEUP_DISPLAY_KIND]


def _timer_settled(home: Path, row_id: str) -> bool:
    rows = [r for r in ledger_rows(home) if r.id == row_id]
    return bool(rows) and rows[0].delivery_state != "pending"


def _reveille(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reveille.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "REVEILLE_HOME": str(home)},
        timeout=60,
    )


def test_a_reminder_fires_once_across_a_sigkill(tmp_path: Path) -> None:
    first = Server(tmp_path, extra_env=FAST)
    try:
        session_id, reply = chat(first.port, "remind me in 3 seconds: check the deploy")
        set_at = time.monotonic()
        assert "Reminder set for" in reply, reply
        match = _WAKEUP_ID.search(reply)
        assert match, reply
        row_id = match.group(1)
        time.sleep(max(0.0, 1.0 - (time.monotonic() - set_at)))
    finally:
        first.stop(signal.SIGKILL)
    assert not _timer_settled(tmp_path, row_id)  # killed before it was due

    second = Server(tmp_path, extra_env=FAST)
    try:
        wait_until(lambda: _timer_settled(tmp_path, row_id))
        [row] = [r for r in ledger_rows(tmp_path) if r.id == row_id]
        assert row.delivery_state == "delivered" and row.kind == "timer"
        wakeups = _wakeups(second.port, session_id)
        assert len(wakeups) == 1, wakeups
        assert "check the deploy" in wakeups[0]["content"]
        # Folded into the next turn once: the demo model restates the reminder's text.
        _, answer = chat(second.port, "anything for me?", session_id=session_id)
        assert answer.count("Reminder: check the deploy") == 1, answer
        _, again = chat(second.port, "and now?", session_id=session_id)
        assert "Reminder:" not in again
        assert len(_wakeups(second.port, session_id)) == 1
    finally:
        assert second.stop() == 0


def test_two_servers_on_one_state_dir_fire_a_reminder_once(tmp_path: Path) -> None:
    servers = [Server(tmp_path, extra_env=FAST), Server(tmp_path, extra_env=FAST)]
    try:
        session_id, reply = chat(servers[0].port, "remind me in 2 seconds: feed the cat")
        row_id = _WAKEUP_ID.search(reply).group(1)  # type: ignore[union-attr]
        wait_until(lambda: _timer_settled(tmp_path, row_id))
        [row] = [r for r in ledger_rows(tmp_path) if r.id == row_id]
        assert row.delivery_state == "delivered" and row.delivery_attempts == 1
        assert len(_wakeups(servers[1].port, session_id)) == 1
    finally:
        for server in servers:
            server.stop()


def test_a_pending_reminder_is_listed_and_cancelled(tmp_path: Path) -> None:
    server = Server(tmp_path, extra_env=FAST)
    try:
        session_id, reply = chat(server.port, "remind me in 600 seconds: water the plants")
        row_id = _WAKEUP_ID.search(reply).group(1)  # type: ignore[union-attr]

        listed = _reveille(tmp_path, "background", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        units = [json.loads(line) for line in listed.stdout.splitlines()]
        [unit] = [u for u in units if u["id"] == row_id]
        assert unit["state"] == "scheduled" and unit["kind"] == "timer"
        assert unit["goal"] == "water the plants" and unit["due_at"] > time.time() + 500
        table = _reveille(tmp_path, "background", "list")
        assert row_id in table.stdout and "scheduled" in table.stdout

        status, _, body = call(server.port, "GET", "/api/background")
        assert status == 200, body
        [item] = [u for u in body["data"] if u["id"] == row_id]
        assert item["state"] == "scheduled" and item["due_at"] == unit["due_at"]

        cancelled = _reveille(tmp_path, "background", "cancel", row_id)
        assert cancelled.returncode == 0 and "cancelled" in cancelled.stdout, cancelled
        [row] = [r for r in ledger_rows(tmp_path) if r.id == row_id]
        assert row.delivery_state == "dropped"
        assert "cancelled" in (row.settled_reason or "")
        listed = _reveille(tmp_path, "background", "list", "--json")
        assert row_id not in listed.stdout
        again = _reveille(tmp_path, "background", "cancel", row_id)
        assert "already finished" in again.stdout
        assert _wakeups(server.port, session_id) == []
    finally:
        server.stop()
