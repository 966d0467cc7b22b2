"""Reminders on one PostgreSQL database shared by two `reveille serve` processes (as on two
hosts): the server that set a reminder, and would fire it, is SIGKILLed before it is due;
the other server fires it, once."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

from gateway.wake import WAKEUP_DISPLAY_KIND
from tests.api_server.serve_support import Server, chat, transcript, wait_until
from tests.pg_support import fresh_url

FAST = {"REVEILLE_TIMERS_MIN_DELAY_SECONDS": "1"}  # the default floor is 10 s
_WAKEUP_ID = re.compile(r"\(id (tmr_\w+)\)")


def _server(tmp_path: Path, name: str, url: str) -> Server:
    home = tmp_path / name
    home.mkdir()
    return Server(home, extra_env={**FAST, "REVEILLE_DATABASE_URL": url})


def _wakeups(port: int, session_id: str) -> list[dict]:
    return [m for m in transcript(port, session_id) if m["display_kind"] == WAKEUP_DISPLAY_KIND]


def test_killing_the_server_that_would_fire_a_reminder_gives_one_firing(tmp_path: Path) -> None:
    url = fresh_url()
    a = _server(tmp_path, "a", url)
    b = None
    try:
        b = _server(tmp_path, "b", url)
        session_id, reply = chat(a.port, "remind me in 3 seconds: renew the certificate")
        assert _WAKEUP_ID.search(reply), reply
        time.sleep(1.0)
        a.stop(signal.SIGKILL)
        assert _wakeups(b.port, session_id) == []  # not due yet

        wakeups = wait_until(lambda: _wakeups(b.port, session_id), timeout=30)
        time.sleep(2.0)  # a second firing would show by now
        wakeups = _wakeups(b.port, session_id)
        assert len(wakeups) == 1, wakeups
        assert "renew the certificate" in wakeups[0]["content"]
    finally:
        for server in (a, b):
            if server is not None and server.proc.poll() is None:
                server.proc.kill()
