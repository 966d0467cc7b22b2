"""Stopping background work and its progress, with real processes and a real SQLite ledger.

The cancel the brief asks for: ``reveille background cancel`` (a real subprocess: another
process on the same store) on a running command settles its row ``cancelled``, the
conversation gets one notice, no result arrives later, and the command's whole process
tree is gone. Around it: cancel twice, cancel a finished unit, a forged id, a result racing
the cancel, and progress seen from another process on the same store.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from delivery.cancel import ALREADY_FINISHED, CANCELLED, NOT_FOUND, active_units
from delivery.ledger import Ledger
from tests.stores import sqlite_ledger
from tests.tools.test_process_adoption import Server as AdoptionServer
from tests.tools.test_process_adoption import dead_server, live_server
from tools.background_processes import ProcessRegistry
from tools.completion_queue import CompletionQueue
from tools.delegation_runtime import DelegationRuntime, Unit, report_progress

WAIT = 20.0


def reveille(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reveille.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "REVEILLE_HOME": str(home)},
        timeout=60,
    )


def wait_for(check: Any, what: str) -> Any:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purpose: it runs nothing (our own children are reaped).
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


class Server:
    """A server's runtime and process registry on the state directory's ledger."""

    def __init__(self, home: Path) -> None:
        self.queue = CompletionQueue()
        self.runtime = DelegationRuntime(Ledger(sqlite_ledger(home / "ledger.db")), self.queue)
        self.registry = ProcessRegistry(self.queue, runtime=lambda: self.runtime)
        self.registry.attach(self.runtime.ledger, directory=home / "processes")
        self.runtime.start_scheduler("test")  # what makes it notice pokes of other processes

    def events(self, timeout: float = WAIT) -> dict[str, Any]:
        return self.queue.get(timeout=timeout)

    def close(self) -> None:
        self.runtime.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    s = Server(tmp_path)
    yield s
    s.close()


def spawn_tree(server: Server, tmp_path: Path) -> tuple[str, list[int]]:
    """A command with a child in the background: the shell and its sleeping child."""
    pids = tmp_path / "pids"
    command = f"echo $$ > {pids}; sleep 300 & echo $! >> {pids}; echo working on it; wait"
    info = server.registry.spawn(command, origin_ui_session_id="ui_1")

    def both() -> list[int] | None:
        text = pids.read_text() if pids.exists() else ""
        found = [int(p) for p in text.split()]
        return found if len(found) == 2 else None

    return info["process_id"], wait_for(both, "the command's pids")


def test_cli_cancel_of_a_running_command(server: Server, tmp_path: Path) -> None:
    row_id, pids = spawn_tree(server, tmp_path)

    # Its progress is seen by another process on the same store.
    def listed() -> dict[str, Any] | None:
        out = reveille(tmp_path, "background", "list", "--json")
        assert out.returncode == 0, out.stderr
        units = [json.loads(line) for line in out.stdout.splitlines()]
        unit = next((u for u in units if u["id"] == row_id), None)
        return unit if unit and unit["line"] == "working on it" else None

    unit = wait_for(listed, "the command's last line in `reveille background list`")
    assert unit["state"] == "running" and unit["step"] == "running the command"
    table = reveille(tmp_path, "background", "list").stdout
    assert row_id in table and "working on it" in table

    out = reveille(tmp_path, "background", "cancel", row_id)
    assert out.returncode == 0, out.stderr
    assert "cancelled" in out.stdout

    notice = server.events()
    assert notice["delivery_id"] == row_id and notice["status"] == "cancelled"
    assert "on the command line" in notice["cancelled_by"]
    assert "Stopped by" in notice["error"]
    for pid in pids:
        wait_for(lambda pid=pid: not alive(pid), f"pid {pid} to be gone")
    wait_for(lambda: not server.registry.list_running(), "the registry to let go")
    with pytest.raises(queue.Empty):
        server.events(timeout=1.0)  # no result after the notice
    row = server.runtime.ledger.get(row_id)
    assert row is not None and row.state == "cancelled"
    assert row.event is not None and row.event["cancelled_by"] == notice["cancelled_by"]

    again = reveille(tmp_path, "background", "cancel", row_id)  # twice: harmless
    assert again.returncode == 0 and "already finished (cancelled)" in again.stdout
    forged = reveille(tmp_path, "background", "cancel", "proc_forged")
    assert forged.returncode == 1 and "no background unit" in forged.stderr


class Gate:
    """A runner that reports progress, then waits until told to finish or stopped."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.stopped = threading.Event()
        self.reported = threading.Event()

    def run(self) -> dict[str, Any]:
        report_progress("running the tool terminal", "line one\nline two\n")
        self.reported.set()
        self.go.wait(WAIT)
        return {"status": "completed", "summary": "the real result"}

    def stop(self) -> None:
        self.stopped.set()
        self.go.set()


def dispatch(server: Server, gate: Gate) -> str:
    unit = Unit(
        "deleg_" + os.urandom(6).hex(),
        {"type": "async_delegation", "delegation_id": "", "goal": "wait", "session_key": "s"},
        gate.run,
        gate.stop,
    )
    unit.request["delegation_id"] = unit.delegation_id
    assert server.runtime.dispatch(unit, kind="delegation", goal="wait", cap=3)["status"] == (
        "dispatched"
    )
    return unit.delegation_id


def test_progress_of_a_sub_agent_is_seen_by_a_second_server(server: Server, tmp_path: Path) -> None:
    gate = Gate()
    row_id = dispatch(server, gate)
    other = Ledger(sqlite_ledger(tmp_path / "ledger.db"))  # a second server on the store
    try:

        def reported() -> Any:
            units = [u for u in active_units(other.views, time.time()) if u.id == row_id]
            return units[0] if units and units[0].line else None

        unit = wait_for(reported, "the unit's progress on the second server")
        assert unit.step == "running the tool terminal" and unit.line == "line two"
        assert unit.state == "running" and unit.elapsed_seconds >= 0
    finally:
        gate.go.set()
        other.close()
    assert server.events()["summary"] == "the real result"
    assert not [u for u in active_units(server.runtime.ledger.views, time.time())]


def test_a_cancel_from_another_server_stops_the_unit_and_its_result_never_comes(
    server: Server, tmp_path: Path
) -> None:
    gate = Gate()
    row_id = dispatch(server, gate)
    assert gate.reported.wait(WAIT)
    other = DelegationRuntime(Ledger(sqlite_ledger(tmp_path / "ledger.db")), CompletionQueue())
    try:
        outcome = other.cancel(row_id, by="the web UI")
        assert outcome.status == CANCELLED
        notice = other.queue.get(timeout=WAIT)  # the canceller's server delivers the notice
        assert notice["status"] == "cancelled" and notice["cancelled_by"] == "the web UI"
        assert gate.stopped.wait(WAIT), "the owner never stopped the unit"
        wait_for(lambda: server.runtime.running_count() == 0, "the slot to free")
        with pytest.raises(queue.Empty):
            server.events(timeout=1.0)  # the runner's result is never delivered
        assert other.cancel(row_id, by="the web UI").status == ALREADY_FINISHED
        assert other.cancel("deleg_forged", by="the web UI").status == NOT_FOUND
    finally:
        other.close()


def test_cancel_of_a_finished_unit_says_so_and_changes_nothing(server: Server) -> None:
    gate = Gate()
    gate.go.set()
    row_id = dispatch(server, gate)
    assert server.events()["status"] == "completed"
    wait_for(lambda: server.runtime.running_count() == 0, "the slot to free")
    outcome = server.runtime.cancel(row_id, by="the API")
    assert outcome.status == ALREADY_FINISHED and outcome.state == "completed"
    row = server.runtime.ledger.get(row_id)
    assert row is not None and row.state == "completed"
    with pytest.raises(queue.Empty):
        server.events(timeout=0.3)


def test_a_result_recorded_first_wins_the_race(server: Server) -> None:
    """One compare-and-set decides: the result was recorded, so the cancel is too late."""
    gate = Gate()
    row_id = dispatch(server, gate)
    assert gate.reported.wait(WAIT)
    ledger = server.runtime.ledger
    event = {"type": "async_delegation", "delegation_id": row_id, "status": "completed"}
    assert ledger.finish(row_id, expected="running", state="completed", event=event)
    assert server.runtime.cancel(row_id, by="the API").status == ALREADY_FINISHED
    gate.go.set()
    wait_for(lambda: server.runtime.running_count() == 0, "the slot to free")


def test_a_command_whose_server_died_is_stopped_by_the_cancel_itself(tmp_path: Path) -> None:
    """Nobody follows the command any more (its server was killed right after the spawn):
    the server that cancels it stops its process tree itself, found by the wrapper's
    identity on disk, and the row is settled with the notice."""
    path = tmp_path / "ledger.db"
    made: list[AdoptionServer] = []
    try:
        dead = dead_server(path, made)
        pids = tmp_path / "pids"
        info = dead.registry.spawn(f"echo $$ > {pids}; sleep 300 & echo $! >> {pids}; wait")
        wait_for(lambda: pids.exists() and len(pids.read_text().split()) == 2, "the pids")
        tree = [int(p) for p in pids.read_text().split()] + [info["pid"]]
        live = live_server(path, made)
        outcome = live.runtime.cancel(info["process_id"], by="the CLI")
        assert outcome.status == CANCELLED
        assert live.runtime.queue.get(timeout=WAIT)["status"] == "cancelled"
        for pid in tree:
            wait_for(lambda pid=pid: not alive(pid), f"pid {pid} to be gone")
    finally:
        for server in made:
            server.close()
