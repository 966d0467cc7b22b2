"""SIGTERM drains background work: a sub-agent that finishes within the grace period is
delivered, one that outlasts it ends `interrupted` with a notice (never `unknown`), and
/readyz says `draining` meanwhile."""

from __future__ import annotations

import re
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from delivery.rows import LedgerRow
from tests.api_server.serve_support import Server, chat, ledger_rows, transcript, wait_until


def _readyz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0  # gone


def test_work_that_ends_within_the_grace_is_delivered_before_the_server_stops(
    tmp_path: Path,
) -> None:
    server = Server(tmp_path, demo_delay=1.5, extra_env={"REVEILLE_DRAIN_SECONDS": "20"})
    session, _ = chat(server.port, "in the background: count to three")
    statuses: list[int] = []

    def watch_readiness() -> None:
        for _ in range(15):
            statuses.append(_readyz(server.port))
            time.sleep(0.1)

    watcher = threading.Thread(target=watch_readiness)
    server.proc.send_signal(signal.SIGTERM)
    watcher.start()
    assert server.proc.wait(timeout=30) == 0
    watcher.join()
    [row] = ledger_rows(tmp_path)
    assert row.state == "completed" and row.delivery_state == "delivered"
    server.wait_for(
        re.compile(r"drained background work in [\d.]+ s: 1 finished in time, 0 interrupted")
    )
    # The operator's log says why it stopped, what it waited for, and how long it took.
    server.wait_for(
        re.compile(
            r"stopping on SIGTERM: \d+ API turn\(s\) running; background work gets up to 20 s"
        )
    )
    server.wait_for(re.compile(r"stopped in [\d.]+ s"))
    assert 503 in statuses  # draining, not ready
    restarted = Server(tmp_path)
    try:
        results = [m for m in transcript(restarted.port, session) if m["display_kind"]]
        assert len(results) == 1 and "count to three" in results[0]["content"]
    finally:
        restarted.stop()


def test_work_that_outlasts_the_grace_ends_interrupted_with_a_notice(tmp_path: Path) -> None:
    server = Server(tmp_path, demo_delay=30, extra_env={"REVEILLE_DRAIN_SECONDS": "0.5"})
    session, _ = chat(server.port, "in the background: a very long count")
    assert server.stop() == 0
    [row] = ledger_rows(tmp_path)
    assert row.state == "interrupted"
    assert "restarting" in str(row.event)
    restarted = Server(tmp_path)
    try:

        def noticed() -> list[dict]:
            return [m for m in transcript(restarted.port, session) if m["display_kind"]]

        [notice] = wait_until(noticed)
        assert "restarting" in notice["content"]
        assert not [r for r in ledger_rows(tmp_path) if r.state == "unknown"]
    finally:
        restarted.stop()


def test_sigterm_with_a_sub_agent_and_a_shell_command_running(tmp_path: Path) -> None:
    """The issue's scenario: the sub-agent ends within the grace and is delivered, the shell
    command outlives the server and is adopted after the restart, nothing says "unknown"."""
    env = {"REVEILLE_DRAIN_SECONDS": "20", "REVEILLE_SHELL_APPROVALS": "never"}
    server = Server(tmp_path, demo_delay=1.0, extra_env=env)
    session, _ = chat(server.port, "in the background: count to three")
    chat(server.port, "run in the background: sleep 3; echo adopted-ok", session)
    statuses: list[int] = []
    watcher = threading.Thread(
        target=lambda: statuses.extend(_readyz(server.port) for _ in range(5))
    )
    server.proc.send_signal(signal.SIGTERM)
    watcher.start()
    assert server.proc.wait(timeout=30) == 0
    watcher.join()
    assert 503 in statuses
    server.wait_for(
        re.compile(r"drained background work in [\d.]+ s: 1 finished in time, 0 interrupted")
    )
    by_kind = {row.kind: row for row in ledger_rows(tmp_path)}
    assert by_kind["delegation"].delivery_state == "delivered"
    assert by_kind["process"].state == "running"  # outlives the server, to be adopted

    restarted = Server(tmp_path, extra_env=env)
    try:

        def process_settled() -> LedgerRow | None:
            rows = [r for r in ledger_rows(tmp_path) if r.kind == "process"]
            return rows[0] if rows and rows[0].delivery_state == "delivered" else None

        row = wait_until(process_settled, timeout=30)
        assert row.state == "completed" and row.event["adopted"] is True
        assert "adopted-ok" in row.event["output_tail"]
        assert not [r for r in ledger_rows(tmp_path) if r.state == "unknown"]
        messages = transcript(restarted.port, session)
        [result] = [m for m in messages if m["display_kind"] == "async_delegation_complete"]
        assert "count to three" in result["content"]
        [wake] = [m for m in messages if "[Background process finished]" in m["content"]]
        assert "adopted-ok" in wake["content"]
        assert not any("unknown" in m["content"].lower() for m in messages)
    finally:
        restarted.stop()
