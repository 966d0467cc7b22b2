"""MCP tasks as background work, in one Reveille server (``serve`` in the test's loop) against
the SDK task server over streamable HTTP: a task-augmented call records the server's task id
on its row, shows the task's status in the running-work view the web UI reads, and comes home
once; cancelling the unit reaches the MCP server as ``tasks/cancel``; a task the server no
longer knows ends ``failed`` with that reason; a tool without task support still runs as
Reveille's own background unit."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agent.providers.demo import DemoModel
from api import deliveries
from reveille.app import serve
from reveille.settings import Settings
from tests.api_server._support import DEMO_DELAY, KEY, RecordingProvider, poll
from tests.api_server.test_approvals import api
from tests.api_server.test_runner import clean_state, messages, user
from tools.async_delegation import cancel_delegation, get_durable_delegation
from tools.mcp.tasks import MAX_POLL_SECONDS, MCP_TASK

from ._tasks_support import TaskServer, task_server

__all__ = ["clean_state"]  # the fixture, used by name


@pytest.fixture
async def app(tmp_path: Path, clean_state: None) -> AsyncIterator[tuple[Any, TaskServer]]:
    with task_server(tmp_path) as tasks:
        settings = Settings(
            home=tmp_path / "home",
            port=0,
            webui_port=0,
            api_key=KEY,
            demo_delay_seconds=DEMO_DELAY,
            mcp_servers=(tasks.config(),),
        )
        async with serve(settings, provider=RecordingProvider(DemoModel(DEMO_DELAY))) as running:
            yield running, tasks


async def start(port: int, tool: str, args: dict[str, Any], *, background: bool = True) -> str:
    """A turn that calls ``tool`` (in the background); the unit's id."""
    text = f"call {tool} with {json.dumps({**args, 'background': True} if background else args)}"
    status, body = await api(
        port, "POST", "/v1/chat/completions", {"model": "reveille-demo", "messages": user(text)}
    )
    assert status == 200, body
    reply = body["choices"][0]["message"]["content"]
    started = json.loads(reply.removeprefix(f"{tool} returned: "))
    assert started["status"] == "dispatched", started
    return str(started["delegation_id"])


def row(deleg_id: str) -> dict[str, Any]:
    found = get_durable_delegation(deleg_id)
    assert found is not None
    return found  # type: ignore[return-value]


async def homecomings(port: int, deleg_id: str) -> list[dict[str, Any]]:
    status, body = await api(port, "GET", "/api/sessions")
    assert status == 200, body
    found = []
    for session in body["data"]:
        for message in await messages(port, session["id"]):
            if (message["display_metadata"] or {}).get("delegation_id") == deleg_id:
                found.append(message)
    return found


async def running_view(deleg_id: str) -> list[dict[str, Any]]:
    """The unit as the web UI's running-work strip reads it (``GET /api/sessions/ID/background``
    answers ``api.deliveries.unfinished_work``)."""
    found = row(deleg_id)
    session = found["origin_ui_session_id"] or found["origin_session_id"] or found["session_key"]
    work = await asyncio.to_thread(deliveries.unfinished_work, session)
    return [w for w in work if w["id"] == deleg_id]


async def test_a_task_call_shows_its_status_and_comes_home_once(app) -> None:
    running, tasks = app
    port = running.adapter.port
    deleg_id = await start(port, "tasks__brew", {"seconds": 2, "what": "oolong"})
    await poll(lambda: (row(deleg_id)["request"] or {}).get(MCP_TASK) is not None, timeout=30)
    (created,) = tasks.lines("created")
    assert row(deleg_id)["request"][MCP_TASK] == {
        "server": "tasks",
        "task_id": created.split()[1],
    }

    async def shown(key: str, text: str) -> bool:
        return any(text in (w[key] or "") for w in await running_view(deleg_id))

    # The task's status (tasks/get, notifications/tasks/status) and its progress
    # (notifications/progress under the call's token), as the web UI's strip shows them.
    await poll(lambda: shown("step", "MCP task working: brewing"), timeout=30)
    await poll(lambda: shown("line", " steeped"), timeout=30)
    (message,) = await poll(lambda: homecomings(port, deleg_id), timeout=30)
    assert message["display_metadata"]["summary"] == "brewed oolong"
    await poll(lambda: row(deleg_id)["delivery_state"] == "delivered")
    assert row(deleg_id)["state"] == "completed"
    assert len(await homecomings(port, deleg_id)) == 1
    assert len(tasks.lines("result")) == 1


async def test_cancelling_the_unit_cancels_the_task_on_the_server(app) -> None:
    running, tasks = app
    deleg_id = await start(running.adapter.port, "tasks__brew", {"seconds": 120})
    await poll(lambda: (row(deleg_id)["request"] or {}).get(MCP_TASK) is not None, timeout=30)
    assert await asyncio.to_thread(cancel_delegation, deleg_id)
    (cancelled,) = await poll(lambda: tasks.lines("cancelled"), timeout=30)
    await poll(lambda: row(deleg_id)["state"] == "cancelled")
    assert cancelled.split()[1] == row(deleg_id)["event"][MCP_TASK]["task_id"]


async def test_a_task_the_server_forgot_ends_failed_with_the_reason(app) -> None:
    running, tasks = app
    port = running.adapter.port
    deleg_id = await start(port, "tasks__brew", {"seconds": 2, "forget": True})
    await poll(lambda: row(deleg_id)["state"] == "failed", timeout=30)
    event = row(deleg_id)["event"]
    assert "no longer knows task" in event["error"] and "unknown task" in event["error"]
    (message,) = await poll(lambda: homecomings(port, deleg_id), timeout=30)
    assert "no longer knows task" in json.dumps(message)
    assert tasks.lines("forgot")


async def test_a_tool_without_task_support_runs_as_a_reveille_unit(app) -> None:
    running, tasks = app
    port = running.adapter.port
    deleg_id = await start(port, "tasks__plain", {})
    (message,) = await poll(lambda: homecomings(port, deleg_id), timeout=30)
    assert message["display_metadata"]["summary"] == "plain answer"
    assert MCP_TASK not in (row(deleg_id)["request"] or {})
    assert tasks.lines("created") == []


async def test_a_status_notification_wakes_the_follower_before_its_poll(app) -> None:
    # The server asks to be polled every ten minutes (capped at MAX_POLL_SECONDS): the task
    # comes home within the test's wait only because its notifications/tasks/status woke the
    # follower.
    running, _ = app
    port = running.adapter.port
    deleg_id = await start(port, "tasks__brew", {"seconds": 0.5, "poll_ms": 600_000})
    (message,) = await poll(lambda: homecomings(port, deleg_id), timeout=MAX_POLL_SECONDS / 2)
    assert message["display_metadata"]["summary"] == "brewed tea"


async def test_a_tool_that_requires_tasks_always_runs_as_one(app) -> None:
    running, tasks = app
    port = running.adapter.port
    deleg_id = await start(port, "tasks__steep", {"seconds": 0.5}, background=False)
    (message,) = await poll(lambda: homecomings(port, deleg_id), timeout=30)
    assert message["display_metadata"]["summary"] == "brewed tea"
    assert len(tasks.lines("created")) == 1
