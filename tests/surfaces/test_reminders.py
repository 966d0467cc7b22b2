"""A reminder set in a chat ("remind me in 3 seconds: ...") comes home as one message, even
when the server that set it is SIGKILLed before it is due: run against every platform of the
contract suite (``conftest.PLATFORMS``), with real `reveille serve` processes and the
platform's stand-in on loopback."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from tests.api_server.serve_support import Server, ledger_rows, wait_until
from tests.surfaces.contract import FakePlatform

FAST = {"REVEILLE_TIMERS_MIN_DELAY_SECONDS": "1"}  # the default floor is 10 s


def _timers(home: Path) -> list[str]:
    return [r.delivery_state for r in ledger_rows(home) if r.kind == "timer"]


def test_a_reminder_comes_home_once_across_a_sigkill(
    tmp_path: Path, platform: FakePlatform
) -> None:
    first = Server(tmp_path, extra_env={**platform.env(), **FAST})
    try:
        platform.say("remind me in 3 seconds: rotate the backups")
        wait_until(lambda: any("Reminder set for" in t for t in platform.replies()), timeout=30)
        set_at = time.monotonic()
        assert _timers(tmp_path) == ["pending"]
        time.sleep(max(0.0, 1.0 - (time.monotonic() - set_at)))
    finally:
        first.stop(signal.SIGKILL)
    assert _timers(tmp_path) == ["pending"]  # killed before it was due

    second = Server(tmp_path, extra_env={**platform.env(), **FAST})
    try:
        wait_until(lambda: _timers(tmp_path) == ["delivered"], timeout=30)
        wait_until(lambda: len(platform.replies()) >= 2, timeout=30)
        time.sleep(1.5)  # a second firing would show by now
        replies = platform.replies()
        assert len(replies) == 2, replies
        assert "rotate the backups" in replies[1]
        [row] = [r for r in ledger_rows(tmp_path) if r.kind == "timer"]
        assert row.delivery_attempts == 1
    finally:
        second.stop()
    third = Server(tmp_path, extra_env={**platform.env(), **FAST})
    try:
        time.sleep(1.5)
        assert len(platform.replies()) == 2
    finally:
        third.stop()
