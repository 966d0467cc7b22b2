"""`reveille serve` and `reveille chat` as real processes, including a SIGKILL between a
delivery and its acknowledgement."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.markers import WAKE_MARKER
from delivery.rows import LedgerRow, RowQuery
from gateway.wake import DELEGATION_DISPLAY_KIND
from reveille.banner import startup_banner
from reveille.chat import ChatClient
from reveille.cli import build_parser
from reveille.settings import Settings
from tests.api_server.serve_support import (
    KEY,
    ROOT,
    Server,
    chat,
    ledger_rows,
    transcript,
    wait_until,
)
from tests.stores import sqlite_ledger


def test_cli_registers_serve_and_chat() -> None:
    parser = build_parser()
    args = parser.parse_args(["serve", "--host", "127.0.0.1", "--port", "9000", "--config", "x"])
    assert (args.host, args.port, args.config) == ("127.0.0.1", 9000, "x")
    args = parser.parse_args(["chat", "--url", "http://h:1/v1", "--key", "k", "--session", "s"])
    assert (args.url, args.key, args.session) == ("http://h:1/v1", "k", "s")
    assert callable(args.func)


def test_banner_says_plainly_when_the_model_is_the_demo(tmp_path) -> None:
    banner = startup_banner(Settings(home=tmp_path), port=8642, model="reveille-demo", restored=2)
    assert "listening on http://127.0.0.1:8642/v1" in banner
    assert "OFFLINE DEMO model" in banner and "not a language model" in banner
    assert "curl -s http://127.0.0.1:8642/v1/chat/completions" in banner
    assert "re-offering 2" in banner
    real = startup_banner(
        Settings(home=tmp_path, provider="openai", model="gpt-x", api_key="k", openai_api_key="sk"),
        port=1,
        model="gpt-x",
        restored=0,
    )
    assert "DEMO" not in real and "gpt-x" in real and "Bearer" in real


def test_serve_and_chat_client(tmp_path) -> None:
    server = Server(tmp_path)
    try:
        server.wait_for(re.compile("OFFLINE DEMO"))
        client = ChatClient(url=server.url + "/v1", key=KEY)
        try:
            session_id = client.open_session()
            assert session_id and session_id.startswith("sess_")
            pieces: list[str] = []
            reply = client.send("in the background: water the plants", on_delta=pieces.append)
            assert "Started in the background" in reply and "".join(pieces) == reply
            arrived = wait_until(client.poll)
            assert any(
                line.startswith("[background result] Background work finished: water the plants")
                for line in arrived
            )
            assert client.poll() == []
            reply = client.send("run in the background: echo chat-wake")
            assert "Started `echo chat-wake`" in reply
            arrived = wait_until(client.poll)
            assert any(line.startswith("[wake-up]") for line in arrived)
        finally:
            client.close()
        assert server.stop() == 0
    finally:
        if server.proc.poll() is None:
            server.proc.kill()


def test_sigkill_between_delivery_and_ack_delivers_exactly_once(tmp_path) -> None:
    first = Server(tmp_path, hold_ack=True)
    try:
        deleg_session, reply = chat(first.port, "in the background: count the stars")
        assert "Started in the background" in reply
        proc_session, reply = chat(first.port, "run in the background: echo survived")
        assert "Started `echo survived`" in reply
        # Both completions were delivered (a delivery row; a wake turn) but not acknowledged.
        first.wait_for(re.compile(r"HOLDING-ACK (deleg_\w+|proc_\w+)"), count=2)
        assert (
            len(
                wait_until(
                    lambda: [
                        m for m in transcript(first.port, proc_session) if m["role"] == "assistant"
                    ][1:]
                )
            )
            == 1
        )
    finally:
        first.stop(signal.SIGKILL)

    second = Server(tmp_path)
    try:
        second.wait_for(re.compile(r"re-offering 2 undelivered completion\(s\)"))

        def settled() -> bool:
            rows = ledger_rows(tmp_path)
            return bool(rows) and all(r.delivery_state == "delivered" for r in rows)

        wait_until(settled)
        rows = transcript(second.port, deleg_session)
        assert len([m for m in rows if m["display_kind"] == DELEGATION_DISPLAY_KIND]) == 1
        rows = transcript(second.port, proc_session)
        wakes = [m for m in rows if m["role"] == "user" and m["content"].startswith(WAKE_MARKER)]
        assert len(wakes) == 1
        assert "echo survived" in wakes[0]["content"]
        assert [m["role"] for m in rows] == ["user", "assistant", "user", "assistant"]
        # The delegation result is folded into the next turn once.
        _, reply = chat(second.port, "what happened?", session_id=deleg_session)
        assert reply.count("Background work finished: count the stars") == 1
        assert second.stop() == 0
    finally:
        if second.proc.poll() is None:
            second.proc.kill()


@pytest.mark.parametrize("ended_before_restart", [False, True], ids=["running", "ended"])
def test_a_background_command_across_a_sigkill_and_restart_reports_its_real_outcome(
    tmp_path, ended_before_restart: bool
) -> None:
    command = "sleep 2; echo done; exit 7"
    first = Server(tmp_path)
    try:
        session, reply = chat(first.port, f"run in the background: {command}")
        assert f"Started `{command}`" in reply
        pid = int(re.search(r"pid (\d+)", reply).group(1))  # type: ignore[union-attr]
    finally:
        first.stop(signal.SIGKILL)
    # The command outlives its server: its wrapper is an orphan now, still running.
    assert Path(f"/proc/{pid}").exists()
    if ended_before_restart:
        wait_until(lambda: not Path(f"/proc/{pid}").exists(), timeout=10)

    second = Server(tmp_path)
    try:

        def wakes() -> list[dict]:
            rows = transcript(second.port, session)
            return [m for m in rows if m["role"] == "user" and m["content"].startswith(WAKE_MARKER)]

        (wake,) = wait_until(wakes, timeout=15)
        text = wake["content"]
        assert "[Background process finished] exit code 7." in text
        assert "Exit code: 7" in text and "done" in text and command in text
        assert "unknown" not in text.lower()

        def settled() -> LedgerRow | None:
            from delivery.ledger import Ledger

            backend = sqlite_ledger(tmp_path / "ledger.db")
            try:
                (row,) = Ledger(backend).query(RowQuery(kind="process", limit=10))
            finally:
                backend.close()
            return row if row.delivery_state == "delivered" else None

        row = wait_until(settled)
        assert row.state == "failed" and row.event["exit_code"] == 7
        assert row.event["output_tail"] == "done\n" and row.event["adopted"] is True
        time.sleep(0.5)
        assert len(wakes()) == 1  # exactly once
        assert not (tmp_path / "processes" / row.id).exists()
        assert second.stop() == 0
    finally:
        if second.proc.poll() is None:
            second.proc.kill()


def serve_refused(home: Path, *args: str, **env_extra: str) -> subprocess.CompletedProcess[str]:
    """`reveille serve` without a key, expected to refuse to start: its exit and output."""
    env = {**os.environ, "REVEILLE_HOME": str(home), "PYTHONPATH": str(ROOT), **env_extra}
    env.pop("API_SERVER_KEY", None)
    return subprocess.run(
        [sys.executable, "-m", "reveille.cli", "serve", "--port", "0", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("host", ["0.0.0.0"])
def test_serve_refuses_public_bind_without_key(tmp_path, host) -> None:
    out = serve_refused(tmp_path, "--host", host)
    assert out.returncode == 1
    assert "API_SERVER_KEY" in out.stderr


def test_a_taken_port_is_named_in_one_message_without_a_traceback(tmp_path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        webui_port = taken.getsockname()[1]
        out = serve_refused(tmp_path, REVEILLE_WEBUI_PORT=str(webui_port))
    assert out.returncode == 1
    assert f"web UI port {webui_port}" in out.stderr and "REVEILLE_WEBUI_PORT" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_server_that_does_not_stop_is_killed_and_named(tmp_path) -> None:
    """The test harness's own hygiene: a server that outlives its stop (here, frozen by
    SIGSTOP) is killed rather than left holding its port for the rest of the run."""
    server = Server(tmp_path)
    with pytest.raises(AssertionError, match="did not stop within 1 s"):
        server.stop(signal.SIGSTOP, timeout=1)
    assert server.proc.poll() == -signal.SIGKILL
