"""MCP tools on the API server with the demo model (``call <tool> with <JSON>``): a call in a
turn, in a background sub-agent whose result comes home, an approval asked and answered at
``/api/approvals``, and a server's question (elicitation) asked and answered there too."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from agent.providers.demo import DemoModel
from gateway.turns.gate import APPROVED_TURN_DISPLAY_KIND
from reveille.app import serve
from reveille.settings import Settings
from tests.api_server._support import DEMO_DELAY, KEY, RecordingProvider, poll
from tests.api_server.test_approvals import api
from tests.api_server.test_runner import DELEGATION_DISPLAY_KIND, clean_state, messages, user
from tools.async_delegation import cancel_delegation, get_durable_delegation
from tools.mcp.manager import mcp_clients

from ._support import stdio_echo

__all__ = ["clean_state"]  # the fixture, used by name


@pytest.fixture
async def app(tmp_path, clean_state):  # type: ignore[no-untyped-def]
    settings = Settings(
        home=tmp_path,
        port=0,
        webui_port=0,
        api_key=KEY,
        demo_delay_seconds=DEMO_DELAY,
        mcp_servers=(stdio_echo(),),
    )
    async with serve(settings, provider=RecordingProvider(DemoModel(DEMO_DELAY))) as running:
        yield running


async def turn(port: int, text: str) -> tuple[str, dict[str, Any]]:
    status, body = await api(
        port, "POST", "/v1/chat/completions", {"model": "reveille-demo", "messages": user(text)}
    )
    assert status == 200, body
    return body["choices"][0]["message"]["content"], body


async def test_a_turn_calls_an_mcp_tool(app) -> None:
    reply, _ = await turn(app.adapter.port, 'call echo__say with {"text": "hello MCP"}')
    assert reply == "echo__say returned: echo: hello MCP"
    assert [s.state for s in mcp_clients.servers()] == ["ready"]


async def test_a_sub_agent_calls_an_mcp_tool_and_its_result_comes_home(app) -> None:
    port = app.adapter.port
    reply, _ = await turn(
        port, 'in the background: call echo__say with {"text": "from a sub-agent"}'
    )
    assert "Started in the background" in reply

    async def delivered() -> list[dict[str, Any]]:
        rows = []
        for sid in await sessions(port):
            rows += [
                r for r in await messages(port, sid) if r["display_kind"] == DELEGATION_DISPLAY_KIND
            ]
        return rows

    (row,) = await poll(delivered, timeout=30)
    # The sub-agent ran on a worker thread's loop; its call ran on the server's session.
    assert "echo: from a sub-agent" in row["display_metadata"]["summary"]


async def sessions(port: int) -> list[str]:
    status, body = await api(port, "GET", "/api/sessions")
    assert status == 200, body
    return [s["id"] for s in body["data"]]


async def test_an_approval_is_asked_and_answered_on_the_api(app) -> None:
    port = app.adapter.port
    note, body = await turn(port, 'call echo__note with {"text": "remember"}')
    approval = body["reveille_approval"]
    assert approval["status"] == "pending" and approval["id"] in note
    assert approval["command"] == 'MCP echo__note {"text": "remember"}'
    status, listed = await api(port, "GET", "/api/approvals")
    assert [a["id"] for a in listed["data"]] == [approval["id"]]
    status, decided = await api(port, "POST", f"/api/approvals/{approval['id']}", {"approve": True})
    assert status == 200 and decided["approval"]["status"] == "approved"

    async def answered() -> list[dict[str, Any]]:
        rows = await messages(port, approval["session_id"])
        return [r for r in rows if r["display_kind"] == APPROVED_TURN_DISPLAY_KIND]

    (row,) = await poll(answered)
    assert "noted: remember" in row["content"]


async def test_a_server_question_is_asked_and_answered_on_the_api(app) -> None:
    port = app.adapter.port
    _, body = await turn(port, 'call echo__confirm with {"question": "deploy now?"}')
    approval = body["reveille_approval"]
    assert approval["command"] == "MCP server echo asks: deploy now?"
    status, _ = await api(port, "POST", f"/api/approvals/{approval['id']}", {"approve": False})
    assert status == 200

    async def answered() -> list[dict[str, Any]]:
        rows = await messages(port, approval["session_id"])
        return [r for r in rows if r["display_kind"] == APPROVED_TURN_DISPLAY_KIND]

    (row,) = await poll(answered)
    assert "answer: decline" in row["content"]


async def test_an_unknown_tool_is_answered_not_called(app) -> None:
    reply, _ = await turn(app.adapter.port, "call echo__nothing with {}")
    assert "no tool of that name" in reply
    reply, _ = await turn(app.adapter.port, "call echo__say with {not json}")
    assert "must be one JSON object" in reply


@pytest.fixture
async def slow_app(tmp_path, clean_state):  # type: ignore[no-untyped-def]
    marker = tmp_path / "cancelled"
    echo = stdio_echo(env={"ECHO_CANCELLED_FILE": str(marker)})
    settings = Settings(
        home=tmp_path,
        port=0,
        webui_port=0,
        api_key=KEY,
        demo_delay_seconds=DEMO_DELAY,
        mcp_servers=(echo,),
    )
    async with serve(settings, provider=RecordingProvider(DemoModel(DEMO_DELAY))) as running:
        yield running, marker


async def test_a_call_in_the_background_comes_home(slow_app) -> None:
    app, _ = slow_app
    port = app.adapter.port
    reply, _ = await turn(port, 'call echo__slow with {"seconds": 0.3, "background": true}')
    started = json.loads(reply.removeprefix("echo__slow returned: "))
    assert started["status"] == "dispatched"
    deleg_id = started["delegation_id"]

    async def delivered() -> list[dict[str, Any]]:
        rows = []
        for sid in await sessions(port):
            for row in await messages(port, sid):
                meta = row["display_metadata"] or {}
                if meta.get("delegation_id") == deleg_id:
                    rows.append(row)
        return rows

    (row,) = await poll(delivered, timeout=30)
    assert row["display_metadata"]["summary"] == "slept"
    await poll(lambda: get_durable_delegation(deleg_id)["delivery_state"] == "delivered")
    assert get_durable_delegation(deleg_id)["state"] == "completed"


async def test_cancelling_a_background_call_cancels_it_on_the_server(slow_app) -> None:
    app, marker = slow_app
    reply, _ = await turn(
        app.adapter.port, 'call echo__slow with {"seconds": 60, "background": true}'
    )
    deleg_id = json.loads(reply.removeprefix("echo__slow returned: "))["delegation_id"]
    await poll(lambda: get_durable_delegation(deleg_id)["state"] == "running")
    assert await asyncio.to_thread(cancel_delegation, deleg_id)
    await poll(marker.exists)
    await poll(lambda: get_durable_delegation(deleg_id)["state"] == "cancelled")
