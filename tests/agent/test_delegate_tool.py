"""`delegate_task`: inline sub-agents, and background dispatch through tools.async_delegation."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
import types

from agent.loop import Agent
from agent.providers.base import ModelReply
from agent.providers.demo import DemoModel
from agent.subagent import run_subagent_sync
from agent.tools import ToolContext, ToolRegistry
from tools.delegate_tool import make_delegate_tool
from tools.toolset import build_default_registry

CTX = ToolContext(
    session_id="api-sess-9", session_key="agent:main:api:dm:9", origin_ui_session_id="ui-9"
)


class BrokenProvider:
    name = "broken"

    async def complete(self, messages, *, tools=None, on_delta=None):
        raise RuntimeError("model is down")


async def _call(tool, **args):
    raw = await ToolRegistry([tool]).call("delegate_task", json.dumps(args), CTX)
    try:
        return json.loads(raw)
    except ValueError:
        return raw


async def test_foreground_runs_the_subagent_off_the_event_loop():
    threads = []

    class RecordingDemo(DemoModel):
        async def complete(self, messages, **kwargs):
            threads.append(threading.current_thread())
            return await super().complete(messages, **kwargs)

    tool = make_delegate_tool(RecordingDemo(delay_seconds=0.05))
    result = await _call(tool, goal="summarise the logs", context="from last night")
    assert result == "Done: summarise the logs. (demo sub-agent result)"
    assert threads and threads[0] is not threading.main_thread()


async def test_foreground_failure_is_reported_to_the_model():
    result = await _call(make_delegate_tool(BrokenProvider()), goal="x")
    assert result == {"error": "the sub-agent failed: model is down"}


async def test_empty_goal_is_refused():
    assert await _call(make_delegate_tool(DemoModel()), goal="  ") == {
        "error": "goal must not be empty"
    }


def test_run_subagent_sync_outcomes():
    assert run_subagent_sync(DemoModel(delay_seconds=0), "g", None) == {
        "status": "completed",
        "summary": "Done: g. (demo sub-agent result)",
    }
    assert run_subagent_sync(BrokenProvider(), "g", None) == {
        "status": "failed",
        "error": "model is down",
    }


def test_run_subagent_sync_honours_the_step_limit():
    class ToolHappy:
        name = "tool-happy"

        async def complete(self, messages, *, tools=None, on_delta=None):
            call = {"id": "c", "type": "function", "function": {"name": "x", "arguments": "{}"}}
            return ModelReply(None, [call])

    outcome = run_subagent_sync(ToolHappy(), "g", None, max_steps=2)
    assert outcome["status"] == "completed"
    assert "step limit" in outcome["summary"]


async def test_background_dispatch_arguments(monkeypatch):
    calls = []

    def fake_dispatch(**kwargs):
        calls.append((kwargs, threading.current_thread()))
        return {"status": "dispatched", "delegation_id": "deleg_cafe"}

    fake_module = types.ModuleType("tools.async_delegation")
    fake_module.dispatch_async_delegation = fake_dispatch
    monkeypatch.setitem(sys.modules, "tools.async_delegation", fake_module)

    provider = DemoModel(delay_seconds=0)
    registry = build_default_registry(provider, shell_enabled=False, max_async_children=5)
    tool = registry.get("delegate_task")
    result = await _call(
        tool,
        goal="write the report",
        context="quarterly",
        background=True,
        toolsets=["terminal"],
        role="writer",
    )
    assert result == {"status": "dispatched", "delegation_id": "deleg_cafe"}
    ((kwargs, thread),) = calls
    assert thread is not threading.main_thread()  # the durable write stays off the loop
    runner = kwargs.pop("runner")
    assert callable(kwargs.pop("interrupt_fn"))  # stops the sub-agent (a cancel, a drain)
    assert kwargs == {
        "goal": "write the report",
        "context": "quarterly",
        "toolsets": ["terminal"],
        "role": "writer",
        "model": "reveille-demo",
        "session_key": "agent:main:api:dm:9",
        "origin_session_id": "api-sess-9",
        "origin_ui_session_id": "ui-9",
        "max_async_children": 5,
    }
    # The runner is what a worker thread calls: no event loop there.
    outcome = await asyncio.to_thread(runner)
    assert outcome == {
        "status": "completed",
        "summary": "Done: write the report. (demo sub-agent result)",
        "tools_used": [],  # it had the terminal, and answered without it
    }


def _wait_for(queue, delegation_id, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        evt = queue.get(timeout=max(0.01, deadline - time.monotonic()))
        if evt.get("delegation_id") == delegation_id:
            return evt
    raise AssertionError(f"no completion for {delegation_id}")


async def test_background_delegation_for_real_returns_at_once_and_completes(real_runtime):
    async_delegation, registry = real_runtime
    queue = registry.completion_queue
    tool = make_delegate_tool(DemoModel(delay_seconds=0.5))
    started = time.monotonic()
    result = await _call(tool, goal="count the stars", context="be quick", background=True)
    assert time.monotonic() - started < 0.5  # the handle comes back before the work ends
    assert result["status"] == "dispatched"
    delegation_id = result["delegation_id"]
    assert delegation_id.startswith("deleg_")

    evt = await asyncio.to_thread(_wait_for, queue, delegation_id)
    assert evt["status"] == "completed"
    assert evt["summary"] == "Done: count the stars. (demo sub-agent result)"
    assert evt["goal"] == "count the stars"
    assert evt["context"] == "be quick"
    assert evt["model"] == "reveille-demo"
    assert evt["session_key"] == "agent:main:api:dm:9"
    assert evt["origin_session_id"] == "api-sess-9"
    assert evt["origin_ui_session_id"] == "ui-9"
    row = async_delegation.get_durable_delegation(delegation_id)
    assert row is not None
    assert row["delivery_state"] == "pending"


async def test_background_failure_is_recorded_as_failed(real_runtime):
    queue = real_runtime[1].completion_queue
    result = await _call(make_delegate_tool(BrokenProvider()), goal="doomed", background=True)
    evt = await asyncio.to_thread(_wait_for, queue, result["delegation_id"])
    assert evt["status"] == "failed"
    assert "model is down" in evt["error"]


async def test_beyond_the_cap_work_waits_or_is_rejected(real_runtime):
    queue = real_runtime[1].completion_queue
    tool = make_delegate_tool(DemoModel(delay_seconds=0.3), max_async_children=1)
    results = [await _call(tool, goal=f"job {i}", background=True) for i in range(3)]
    assert results[0]["status"] == "dispatched"
    assert {r["status"] for r in results[1:]} <= {"queued", "rejected"}
    for result in results:
        if result["status"] != "rejected":
            evt = await asyncio.to_thread(_wait_for, queue, result["delegation_id"])
            assert evt["status"] == "completed"


async def test_demo_turn_end_to_end_with_the_default_registry(real_runtime, tmp_path):
    """'in the background: ...' through the agent, the real tool and the real ledger."""
    queue = real_runtime[1].completion_queue
    provider = DemoModel(delay_seconds=0.2)
    registry = build_default_registry(provider, shell_enabled=False, workdir=str(tmp_path))
    result = await Agent(provider, registry).run(
        [{"role": "user", "content": "in the background: tidy the garden"}], CTX
    )
    tool_result = json.loads(result.new_messages[1]["content"])
    delegation_id = tool_result["delegation_id"]
    assert delegation_id in result.content
    assert result.content.startswith("Started in the background: tidy the garden.")
    evt = await asyncio.to_thread(_wait_for, queue, delegation_id)
    assert evt["summary"] == "Done: tidy the garden. (demo sub-agent result)"


async def test_demo_turn_with_the_shell_disabled_runs_nothing(tmp_path):
    provider = DemoModel(delay_seconds=0)
    registry = build_default_registry(provider, shell_enabled=False, workdir=str(tmp_path))
    assert registry.names() == ["delegate_task", "terminal", "schedule_wakeup", "schedule", "watch"]
    result = await Agent(provider, registry).run(
        [{"role": "user", "content": f"run in the background: touch {tmp_path}/marker"}], CTX
    )
    assert "the shell tool is disabled" in result.content
    assert "REVEILLE_SHELL_ENABLED=1" in result.content
    time.sleep(0.2)
    assert not (tmp_path / "marker").exists()


async def test_background_writes_the_origin_session_before_dispatching(real_runtime):
    async_delegation, _registry = real_runtime
    seen: list[int] = []

    async def write_session() -> None:
        seen.append(len(async_delegation.list_delegations()))

    ctx = ToolContext(session_id="api-sess-9", before_background=write_session)
    raw = await ToolRegistry([make_delegate_tool(DemoModel())]).call(
        "delegate_task", json.dumps({"goal": "g", "background": True}), ctx
    )
    assert json.loads(raw)["status"] == "dispatched"
    assert seen == [0]  # the hook ran while nothing was dispatched yet

    async def storage_down() -> None:
        raise RuntimeError("session store unavailable")

    ctx = ToolContext(session_id="api-sess-9", before_background=storage_down)
    raw = await ToolRegistry([make_delegate_tool(DemoModel())]).call(
        "delegate_task", json.dumps({"goal": "g2", "background": True}), ctx
    )
    assert "session store unavailable" in raw
    assert len(async_delegation.list_delegations()) == 1  # the refused one never started
