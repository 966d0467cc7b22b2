"""A `reveille serve` SIGKILLed between the claims of a combined wake-up and their
acknowledgements: after a restart every row is offered again and delivered once, and the
combined turn, stored before the kill, is not run a second time."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

from agent.markers import read_wake_data
from gateway.config import Platform
from gateway.session import SessionSource
from tests.api_server.serve_support import ledger_rows
from tests.sessions._support import make_session
from tests.stores import session_file_store
from tests.webui.test_two_processes import Serve, _pending_completions, wait_delivered

HOLDING = re.compile(r"HOLDING-ACK (deleg_\w+)")


def _wait_line(server: Serve, pattern: re.Pattern[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(pattern.search(line) for line in list(server.lines)):
            return
        assert server.proc.poll() is None, "".join(server.lines)
        time.sleep(0.05)
    raise AssertionError("".join(server.lines))


def _woken(home: Path, sid: str) -> list[list[str]]:
    """The delivery ids of each wake-up turn stored in ``sid``, in order."""
    with session_file_store(home / "sessions.db") as store:
        messages = store.messages(sid)
    return [
        [meta["delegation_id"] for meta in read_wake_data(m.content)]
        for m in messages
        if m.role == "user" and (m.display_metadata or {}).get("wake")
    ]


def test_a_combined_wake_up_killed_before_its_acks_is_delivered_once(tmp_path: Path) -> None:
    home = tmp_path / "home"
    sid = "webui-combined-crash"
    with session_file_store(home / "sessions.db") as store:
        make_session(store, sid, source=SessionSource(platform=Platform.WEBUI, chat_id=sid))
    ids = _pending_completions(home, sid, 5)

    # The first server re-offers the five at start: one combined wake-up turn, stored; its
    # acknowledgements are held, and the server is killed there.
    first = Serve(home, REVEILLE_TEST_HOLD_ACK="1")
    try:
        _wait_line(first, HOLDING)
    finally:
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(timeout=30)
    rows = {r.id: r for r in ledger_rows(home) if r.id in ids}
    assert all(r.delivery_state == "pending" for r in rows.values())
    assert all(r.claim_token is not None for r in rows.values())  # claimed, never acked
    [stored] = _woken(home, sid)
    assert sorted(stored) == sorted(ids)

    # The restart offers every row again: delivered once each, the stored turn not rerun.
    second = Serve(home)
    try:
        wait_delivered(home, ids)
        time.sleep(0.5)  # a second turn, had one started, would be stored by now
    finally:
        assert second.stop() == 0, "".join(second.lines)
    rows = {r.id: r for r in ledger_rows(home) if r.id in ids}
    assert all(r.delivery_state == "delivered" for r in rows.values())
    assert _woken(home, sid) == [stored]
