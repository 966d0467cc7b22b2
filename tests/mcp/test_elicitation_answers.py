"""A server's form answered with values where a surface can carry them: ``POST
/api/approvals/{id}`` with ``values`` (a real ``serve`` with ``form_server.py`` over stdio) and
``reveille approvals approve ID --values JSON`` (a real subprocess on the store a question
waits in). Values are checked against the form before anything is decided; a yes without
values (what a Telegram keyboard or a web UI card sends) takes the defaults, or declines a
form a yes cannot fill. The form and its answer are kept in every session backend."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agent.providers.demo import DemoModel
from delivery.session_backend import ApprovalRecord
from gateway.approvals import Approvals
from gateway.session import SessionSource, SessionStore
from gateway.turns.gate import APPROVED_TURN_DISPLAY_KIND
from gateway.turns.hold import TurnHold
from reveille.app import serve
from reveille.settings import Settings
from tests.api_server._support import DEMO_DELAY, KEY, RecordingProvider, poll
from tests.api_server.test_approvals import api
from tests.api_server.test_runner import clean_state, messages, user
from tests.mcp.form_server import SIGNUP
from tests.reveille.test_approvals_cli import areveille
from tests.sessions._support import BACKENDS, make_backend, make_session
from tests.stores import session_file_store
from tools.mcp.config import McpServerConfig
from tools.mcp.elicitation import asking_form

__all__ = ["clean_state"]  # the fixture, used by name

FORMS = Path(__file__).with_name("form_server.py")
SIGNED_UP = {"email": "ada@example.org", "plan": "free", "seats": 2}


@pytest.fixture
async def app(tmp_path, clean_state):  # type: ignore[no-untyped-def]
    forms = McpServerConfig(name="forms", command=(sys.executable, str(FORMS)))
    settings = Settings(
        home=tmp_path,
        port=0,
        webui_port=0,
        api_key=KEY,
        demo_delay_seconds=DEMO_DELAY,
        mcp_servers=(forms,),
    )
    async with serve(settings, provider=RecordingProvider(DemoModel(DEMO_DELAY))) as running:
        yield running


async def test_the_api_answers_a_form_with_values(app) -> None:
    port = app.adapter.port
    status, body = await api(
        port,
        "POST",
        "/v1/chat/completions",
        {"model": "reveille-demo", "messages": user("call forms__signup with {}")},
    )
    assert status == 200, body
    approval = body["reveille_approval"]
    assert approval["command"].startswith("MCP server forms asks: Sign up?\n- email (string")
    status, listed = await api(port, "GET", "/api/approvals")
    (shown,) = listed["data"]
    assert shown["form"] == SIGNUP
    path = f"/api/approvals/{approval['id']}"
    for bad, why in [
        ({"email": "ada@example.org", "plan": "gold"}, "field 'plan' takes one of free, pro"),
        ({"plan": "pro"}, "field 'email' is required"),
    ]:
        status, refused = await api(port, "POST", path, {"approve": True, "values": bad})
        assert status == 400 and refused["error"]["code"] == "invalid_answer", refused
        assert why in refused["error"]["message"] and refused["error"]["param"] == "values"
    status, refused = await api(port, "POST", path, {"approve": True, "values": [1]})
    assert status == 400 and refused["error"]["code"] == "invalid_decision"
    status, decided = await api(
        port, "POST", path, {"approve": True, "values": {"email": "ada@example.org", "seats": 2}}
    )
    assert status == 200, decided
    assert decided["approval"]["status"] == "approved"
    assert decided["approval"]["answer"] == SIGNED_UP

    async def answered() -> list[dict[str, Any]]:
        rows = await messages(port, approval["session_id"])
        return [r for r in rows if r["display_kind"] == APPROVED_TURN_DISPLAY_KIND]

    (row,) = await poll(answered, timeout=30)
    assert "accept " + json.dumps(SIGNED_UP, sort_keys=True) in row["content"]


async def test_the_cli_answers_a_form_and_a_bare_yes_declines_one_it_cannot_fill(
    tmp_path: Path,
) -> None:
    store = session_file_store(tmp_path / "sessions.db")
    try:
        make_session(store, "sess_cli", source=SessionSource(platform="api_server", chat_id="x"))
        hold = TurnHold(store, "sess_cli")
        assert await hold.take()
        approvals = Approvals(store, poll_seconds=0.05)
        confirm = approvals.confirm_for("sess_cli")

        async def ask() -> tuple[bool, object]:
            with asking_form(SIGNUP) as question:
                yes = await confirm("MCP server forms asks: Sign up?")
            return yes, question.answer

        # With values: checked, then kept and handed to the asking side.
        waiting = asyncio.create_task(ask())
        pending = await _pending(approvals)
        assert pending.form and json.loads(pending.form) == SIGNUP
        listed = await areveille(tmp_path, "approvals", "list", "--json")
        assert json.loads(listed.stdout)["form"] == SIGNUP
        bad = await areveille(
            tmp_path,
            "approvals",
            "approve",
            pending.id,
            "--values",
            '{"email": "a@b.c", "seats": "two"}',
        )
        assert bad.returncode == 1 and "field 'seats' takes a number" in bad.stderr
        assert "nothing was decided" in bad.stderr
        good = await areveille(
            tmp_path,
            "approvals",
            "approve",
            pending.id,
            "--values",
            '{"email": "ada@example.org", "seats": 2}',
        )
        assert good.returncode == 0, good.stderr
        assert await asyncio.wait_for(waiting, 30) == (True, SIGNED_UP)

        # A bare yes (a yes/no surface) cannot fill a required field without a default.
        waiting = asyncio.create_task(ask())
        pending = await _pending(approvals)
        bare = await areveille(tmp_path, "approvals", "approve", pending.id)
        assert bare.returncode == 0 and "declined" in bare.stdout
        assert await asyncio.wait_for(waiting, 30) == (False, None)
        decided = store.get_approval(pending.id)
        assert decided is not None and decided.status == "denied"
        await hold.release()
    finally:
        store.close()


async def _pending(approvals: Approvals) -> ApprovalRecord:
    while not (found := await approvals.pending()):
        await asyncio.sleep(0.02)
    (record,) = found
    return record


@pytest.mark.parametrize("kind", BACKENDS)
def test_every_backend_keeps_the_form_and_its_answer(kind: str, tmp_path: Path) -> None:
    store = SessionStore(make_backend(kind, tmp_path))
    try:
        schema = json.dumps(SIGNUP)
        asked = ApprovalRecord(
            "appr_f",
            "sess_f",
            "",
            "MCP server forms asks",
            "pending",
            time.time(),
            unit_id="deleg_1",
            owner="x",
            expires_at=time.time() + 60,
            form=schema,
        )
        assert store.ask_approval(asked)
        assert store.get_approval("appr_f") == asked
        decided, changed = store.decide_approval("appr_f", True, json.dumps(SIGNED_UP))
        assert changed and decided.form == schema and json.loads(decided.answer) == SIGNED_UP
        assert store.get_approval("appr_f") == decided
    finally:
        store.close()
