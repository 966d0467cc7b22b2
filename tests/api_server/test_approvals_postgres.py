"""Approvals across `reveille serve` processes on one PostgreSQL database (as on two hosts):
a turn waiting on server A is listed and decided through server B, B refuses a turn that
would cross it, and A's turn goes on and lands its answer once."""

from __future__ import annotations

from pathlib import Path

from gateway.turns.gate import APPROVED_TURN_DISPLAY_KIND
from tests.api_server.serve_support import Server, call, transcript, wait_until
from tests.pg_support import fresh_url


def _server(tmp_path: Path, name: str, url: str) -> Server:
    home = tmp_path / name
    home.mkdir()
    env = {"REVEILLE_DATABASE_URL": url, "REVEILLE_SHELL_APPROVALS": "always"}
    return Server(home, extra_env=env)


def test_an_approval_asked_on_one_server_is_decided_on_another(tmp_path: Path) -> None:
    url = fresh_url()
    a = _server(tmp_path, "a", url)
    b = None
    try:
        b = _server(tmp_path, "b", url)
        body = {
            "model": "reveille-demo",
            "messages": [{"role": "user", "content": "run in the background: echo on-a"}],
        }
        status, headers, answer = call(a.port, "POST", "/v1/chat/completions", body)
        assert status == 200, answer
        approval = answer["reveille_approval"]
        session = headers["X-Hermes-Session-Id"]
        status, _, listed = call(b.port, "GET", "/api/approvals")
        assert [x["id"] for x in listed["data"]] == [approval["id"]]
        more = {"model": "reveille-demo", "messages": [{"role": "user", "content": "hi"}]}
        status, _, busy = call(
            b.port, "POST", "/v1/chat/completions", more, {"X-Hermes-Session-Id": session}
        )
        assert status == 409 and busy["error"]["code"] == "session_busy"
        status, _, decided = call(
            b.port, "POST", f"/api/approvals/{approval['id']}", {"approve": True}
        )
        assert status == 200 and decided["approval"]["status"] == "approved"
        status, _, again = call(
            a.port, "POST", f"/api/approvals/{approval['id']}", {"approve": True}
        )
        assert status == 409 and again["error"]["code"] == "approval_already_decided"

        def answered() -> list[dict]:
            rows = transcript(b.port, session)
            return [r for r in rows if r["display_kind"] == APPROVED_TURN_DISPLAY_KIND]

        (row,) = wait_until(answered, timeout=30)
        assert "Started `echo on-a` in the background" in row["content"]
    finally:
        for s in (a, b):
            if s is not None and s.proc.poll() is None:
                s.proc.kill()
