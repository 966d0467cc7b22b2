"""`reveille serve` processes on one PostgreSQL database, each with its own REVEILLE_HOME
(as on separate hosts): sessions continue through any of them, and when one of three, which
claims to run on another host, is SIGKILLed mid-delivery, the survivors notice by its lapsed
heartbeat and recover its work within peer_timeout_seconds + 5 s, each result delivered
once whichever server is asked."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

from gateway.wake import DELEGATION_DISPLAY_KIND
from tests.api_server.serve_support import Server, chat, ledger_rows, transcript, wait_until
from tests.pg_support import fresh_url

PEER_TIMEOUT = 2.0


def _results(port: int, session_id: str) -> list[dict]:
    return [m for m in transcript(port, session_id) if m["display_kind"] == DELEGATION_DISPLAY_KIND]


def _server(tmp_path: Path, name: str, url: str, **kw) -> Server:
    home = tmp_path / name
    home.mkdir()
    env = {"REVEILLE_DATABASE_URL": url, "REVEILLE_PEER_TIMEOUT_SECONDS": str(PEER_TIMEOUT)}
    env.update(kw.pop("extra_env", {}))
    return Server(home, extra_env=env, **kw)


def test_a_session_continues_through_another_server(tmp_path: Path) -> None:
    url = fresh_url()
    a = _server(tmp_path, "a", url)
    b = None
    try:
        b = _server(tmp_path, "b", url)
        session, _ = chat(a.port, "in the background: count the stars")
        wait_until(lambda: len(_results(b.port, session)) == 1, timeout=20)
        chat(b.port, "and now?", session_id=session)
        texts = [m["content"] for m in transcript(a.port, session)]
        assert "and now?" in texts
        time.sleep(0.5)
        assert len(_results(a.port, session)) == 1
    finally:
        for s in (a, b):
            if s is not None and s.proc.poll() is None:
                s.proc.kill()


def test_a_remote_server_killed_mid_delivery_is_recovered_by_heartbeat(tmp_path: Path) -> None:
    url = fresh_url()
    doomed = _server(
        tmp_path,
        "doomed",
        url,
        hold_ack=True,
        demo_delay=2.0,
        extra_env={"REVEILLE_TEST_HOSTNAME": "far-away-host"},
    )
    survivor = other = None
    try:
        survivor = _server(tmp_path, "survivor", url)
        other = _server(tmp_path, "other", url)  # a third server races the survivor for it
        held_session, _ = chat(doomed.port, "in the background: count the stars")
        doomed.wait_for(re.compile(r"HOLDING-ACK deleg_\w+"))  # delivered, not acknowledged
        running_session, _ = chat(doomed.port, "in the background: map the coast")
        wait_until(lambda: any(r.state == "running" for r in ledger_rows(url)))

        doomed.stop(signal.SIGKILL)
        killed_at = time.monotonic()

        def settled() -> bool:
            rows = ledger_rows(url)
            return len(rows) == 2 and all(r.delivery_state == "delivered" for r in rows)

        wait_until(settled, timeout=PEER_TIMEOUT + 10)
        took = time.monotonic() - killed_at
        print(f"recovered {took:.2f} s after the kill (peer timeout {PEER_TIMEOUT} s)")
        assert took < PEER_TIMEOUT + 5, took
        held = _results(survivor.port, held_session)
        assert len(held) == 1 and "count the stars" in held[0]["content"]
        running = _results(survivor.port, running_session)
        assert len(running) == 1 and "unknown" in running[0]["content"].lower()
        assert {r.state for r in ledger_rows(url)} == {"completed", "unknown"}
        logs = "".join(survivor.lines) + "".join(other.lines)
        assert "stopped renewing its heartbeat" in logs
        time.sleep(0.5)
        for port in (survivor.port, other.port):  # once, whichever server is asked
            assert len(_results(port, held_session)) == 1
            assert len(_results(port, running_session)) == 1
        assert survivor.stop() == 0
        assert other.stop() == 0
    finally:
        for s in (doomed, survivor, other):
            if s is not None and s.proc.poll() is None:
                s.proc.kill()
