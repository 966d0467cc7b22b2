"""Sampling on the API server: a server's ``sampling/createMessage`` during a turn's tool call
is asked at ``/api/approvals`` (``sampling = "ask"``, the default), and once approved the
server gets the answer of the model the API server serves (the demo model)."""

from __future__ import annotations

from typing import Any

from gateway.turns.gate import APPROVED_TURN_DISPLAY_KIND
from tests.api_server._support import poll
from tests.api_server.test_approvals import api
from tests.api_server.test_runner import clean_state, messages, user
from tests.mcp.test_elicitation_answers import app

__all__ = ["app", "clean_state"]  # the fixtures, used by name


async def test_sampling_is_approved_on_the_api_and_answered_by_the_served_model(app) -> None:
    port = app.adapter.port
    text = 'call forms__ask_model with {"prompt": "name a colour"}'
    status, body = await api(
        port, "POST", "/v1/chat/completions", {"model": "reveille-demo", "messages": user(text)}
    )
    assert status == 200, body
    approval = body["reveille_approval"]
    assert approval["command"] == (
        "MCP server forms asks to use the model (at most 200 tokens): name a colour"
    )
    status, decided = await api(port, "POST", f"/api/approvals/{approval['id']}", {"approve": True})
    assert status == 200 and decided["approval"]["status"] == "approved"

    async def answered() -> list[dict[str, Any]]:
        rows = await messages(port, approval["session_id"])
        return [r for r in rows if r["display_kind"] == APPROVED_TURN_DISPLAY_KIND]

    (row,) = await poll(answered, timeout=30)
    assert "model reveille-demo (endTurn): " in row["content"]
    assert "name a colour" in row["content"]  # what the demo model was told, echoed
