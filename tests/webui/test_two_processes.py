"""Two `reveille serve` processes on one state directory never start the same wake-up turn
twice: both re-offer the pending completions at start, the ledger's claim admits one."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import tools.async_delegation as ad
from agent.markers import WAKE_MARKER, read_wake_data
from gateway.config import Platform
from gateway.session import SessionSource
from tests.ports import free_port
from tests.sessions._support import make_session
from tests.stores import session_file_store, sqlite_ledger
from tools.completion_queue import CompletionQueue

ROOT = Path(__file__).resolve().parents[2]
SERVE = ROOT / "tests" / "api_server" / "_serve_proc.py"
WEBUI_LINE = re.compile(r"web UI: http://127\.0\.0\.1:(\d+)/")


class Serve:
    """A `reveille serve` subprocess on ``home`` (the API on any free port, the web UI on a
    free port of its own), with ``env`` added to its environment."""

    def __init__(self, home: Path, **env_extra: str) -> None:
        env = {
            **os.environ,
            "REVEILLE_HOME": str(home),
            "REVEILLE_DEMO_DELAY_SECONDS": "0",
            "REVEILLE_WEBUI_PORT": str(free_port()),
            "API_SERVER_KEY": "two-procs",
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            **env_extra,
        }
        env.pop("REVEILLE_CONFIG", None)
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVE), "serve", "--port", "0"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def wait_listening(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(WEBUI_LINE.search(line) for line in list(self.lines)):
                return
            assert self.proc.poll() is None, "".join(self.lines)
            time.sleep(0.05)
        raise AssertionError("".join(self.lines))

    @property
    def webui_port(self) -> int:
        found = next(m for line in list(self.lines) if (m := WEBUI_LINE.search(line)))
        return int(found.group(1))

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        return self.proc.wait(timeout=30)


def _pending_completions(home: Path, sid: str, count: int) -> list[str]:
    """Completed delegations of web UI session ``sid`` whose wake-ups are still pending."""
    ad.reset_runtime()
    ad.configure_runtime(str(home / "ledger.db"), completion_queue=CompletionQueue())
    try:
        ids = []
        for i in range(count):
            res = ad.dispatch_async_delegation(
                goal=f"job {i}",
                runner=lambda i=i: {"status": "completed", "summary": f"result {i}"},
                session_key=f"agent:main:webui:dm:{sid}",
                origin_session_id=sid,
                origin_ui_session_id=sid,
            )
            ids.append(str(res["delegation_id"]))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            rows = [ad.get_durable_delegation(i) for i in ids]
            if all(r and r["state"] == "completed" for r in rows):
                break
            time.sleep(0.02)
        return ids
    finally:
        ad.reset_runtime()


def wait_delivered(home: Path, ids: list[str], timeout: float = 60) -> None:
    """Until every one of the ledger rows ``ids`` in ``home`` is delivered."""
    from delivery.ledger import Ledger

    ledger = Ledger(sqlite_ledger(home / "ledger.db"))
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rows = [ledger.get(i) for i in ids]
            if all(r and r.delivery_state == "delivered" for r in rows):
                return
            time.sleep(0.1)
        raise AssertionError(f"not all delivered: {rows}")
    finally:
        ledger.close()


def test_two_serve_processes_start_each_wakeup_once(tmp_path: Path) -> None:
    home = tmp_path / "home"
    sid = "webui-shared"
    with session_file_store(home / "sessions.db") as store:
        make_session(store, sid, source=SessionSource(platform=Platform.WEBUI, chat_id=sid))
    ids = _pending_completions(home, sid, 6)

    first, second = Serve(home), Serve(home)
    try:
        first.wait_listening()
        second.wait_listening()
        ad.reset_runtime()
        wait_delivered(home, ids)
        time.sleep(0.5)  # a second turn, had one started, would be stored by now
    finally:
        assert first.stop() == 0, "".join(first.lines)
        assert second.stop() == 0, "".join(second.lines)

    with session_file_store(home / "sessions.db") as store:
        messages = store.messages(sid)
    # A wake-up may carry several results (combined wake-ups): one data line each.
    woken = [
        meta["delegation_id"]
        for m in messages
        if m.role == "user" and m.content.startswith(WAKE_MARKER)
        for meta in read_wake_data(m.content)
    ]
    assert sorted(woken) == sorted(ids), woken
