"""Sub-agents with tools, driven by a fake OpenAI-compatible model on loopback (real HTTP).

The sub-agent runs on a worker thread with its own event loop and its own tool loop; the
fake model (FakeOpenAI of test_openai_compat) scripts what it asks for, and records what
each call saw, so the tests assert on what the model was offered and was told.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agent.markers import SUBAGENT_MARKER
from agent.tools import ToolContext, ToolRegistry
from gateway.wake_text import format_wake_text
from tests.agent.test_openai_compat import FakeOpenAI, completion, provider_for, slow
from tests.sessions._support import make_session
from tools.delegate_tool import DelegationLimits
from tools.shell_tool import DENIED_ERROR
from tools.toolset import build_default_registry

CTX = ToolContext(session_id="api-sess-7", session_key="agent:main:api:dm:7")


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    server = FakeOpenAI()
    await server.start()
    yield server
    await server.stop()


def tool_call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def registry_for(
    fake: FakeOpenAI, workdir: Path, *, shell: bool = True, **limits: Any
) -> ToolRegistry:
    provider = provider_for(fake)
    return build_default_registry(
        provider,
        shell_enabled=shell,
        workdir=str(workdir),
        delegation=DelegationLimits(**limits),
    )


async def delegate(registry: ToolRegistry, ctx: ToolContext = CTX, **args: Any) -> Any:
    raw = await registry.call("delegate_task", json.dumps(args), ctx)
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def offered(request: dict[str, Any]) -> list[str]:
    return [tool["function"]["name"] for tool in request["body"].get("tools") or []]


def tool_messages(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in request["body"]["messages"] if m["role"] == "tool"]


def _wait_for(queue: Any, delegation_id: str, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        evt = queue.get(timeout=max(0.01, deadline - time.monotonic()))
        if evt.get("delegation_id") == delegation_id:
            return evt
    raise AssertionError(f"no completion for {delegation_id}")


async def completion_of(real_runtime: Any, handle: dict[str, Any]) -> dict[str, Any]:
    assert handle["status"] == "dispatched", handle
    queue = real_runtime[1].completion_queue
    return await asyncio.to_thread(_wait_for, queue, handle["delegation_id"])


async def test_a_background_subagent_calls_a_tool_twice_and_says_which_tools_it_used(
    fake, real_runtime, tmp_path
):
    fake.script = [
        completion(None, [tool_call("c1", "terminal", command="echo first-output")]),
        completion("One more.", [tool_call("c2", "terminal", command="echo second-output")]),
        completion("Both ran: first-output, then second-output."),
    ]
    registry = registry_for(fake, tmp_path)
    handle = await delegate(registry, goal="run the two checks", background=True)
    evt = await completion_of(real_runtime, handle)

    assert evt["status"] == "completed"
    assert evt["summary"] == "One more.\n\nBoth ran: first-output, then second-output."
    assert evt["tools_used"] == [{"name": "terminal", "calls": 2}]
    assert evt["toolsets"] == ["terminal"]  # the default: the parent's tools but delegation
    assert len(fake.requests) == 3
    first, second, third = fake.requests
    assert SUBAGENT_MARKER in first["body"]["messages"][0]["content"]
    assert offered(first) == ["terminal"]  # at the depth limit: no delegate_task
    # The model saw each tool's real result before its next step.
    (seen,) = tool_messages(second)
    assert seen["tool_call_id"] == "c1"
    assert json.loads(seen["content"])["output"] == "first-output\n"
    assert [json.loads(m["content"])["output"] for m in tool_messages(third)] == [
        "first-output\n",
        "second-output\n",
    ]
    row = real_runtime[0].get_durable_delegation(handle["delegation_id"])
    assert row["state"] == "completed"
    assert row["result"]["tools_used"] == [{"name": "terminal", "calls": 2}]
    # The wake-up says so in one line.
    assert "\nTools used: terminal (2 calls)\n" in format_wake_text(evt)


async def test_a_subagent_whose_model_stops_answering_ends_stalled_with_what_it_had(
    fake, real_runtime, tmp_path
):
    fake.script = [
        completion(None, [tool_call("c1", "terminal", command="echo partial-finding")]),
        slow(fake, 60),
    ]
    registry = registry_for(fake, tmp_path, stall_seconds=1.0)
    handle = await delegate(registry, goal="investigate", background=True)
    evt = await completion_of(real_runtime, handle)

    assert evt["status"] == "stalled"
    assert "nothing moved for 1 s while waiting for the model" in evt["error"]
    assert "partial-finding" in evt["summary"]  # what it had so far
    assert evt["tools_used"] == [{"name": "terminal", "calls": 1}]
    row = real_runtime[0].get_durable_delegation(handle["delegation_id"])
    assert (row["state"], row["delivery_state"]) == ("stalled", "pending")
    text = format_wake_text(evt)
    assert "Status: stalled" in text and "partial-finding" in text


async def test_a_tool_running_past_the_stall_limit_is_killed_and_the_subagent_stalls(
    fake, tmp_path
):
    pid_file = tmp_path / "pid"
    fake.script = [
        completion(None, [tool_call("c1", "terminal", command="echo started")]),
        completion(None, [tool_call("c2", "terminal", command=f"echo $$ > {pid_file}; sleep 60")]),
    ]
    registry = registry_for(fake, tmp_path, stall_seconds=1.0)
    result = await delegate(registry, goal="wait for something")  # inline this time

    assert "the sub-agent stalled" in result["error"]
    assert "while running the tool terminal" in result["error"]
    assert "started" in result["partial_result"]
    assert "(still running when it stopped)" in result["partial_result"]
    assert len(fake.requests) == 2  # no model call after the stall
    # The command's process group was killed with the run.
    assert await _gone(int(pid_file.read_text()))


async def test_the_depth_limit_bounds_fan_out(fake, real_runtime, tmp_path):
    async_delegation = real_runtime[0]
    registry = registry_for(fake, tmp_path)  # max_depth 1: sub-agents cannot delegate

    refused = await delegate(registry, goal="g", toolsets=["delegation"], background=True)
    assert "cannot delegate further" in refused["error"]
    assert "max_depth" in refused["error"]
    unknown = await delegate(registry, goal="g", toolsets=["terminal", "web"], background=True)
    assert unknown == {"error": "unknown toolset(s): 'web'; available: terminal, timers"}
    assert await delegate(registry, goal="g", toolsets=["delegate_task"]) == refused
    assert async_delegation.list_delegations() == []  # refused at dispatch: nothing ran
    assert fake.requests == []

    # Two levels: the sub-agent may delegate once more; its own sub-agent may not.
    too_deep = tool_call("d1", "delegate_task", goal="deeper", toolsets=["delegation"])
    fake.script = [
        completion(None, [too_deep]),
        completion(None, [tool_call("d2", "delegate_task", goal="deeper")]),
        completion("deep answer"),
        completion("top answer"),
    ]
    registry = registry_for(fake, tmp_path, max_depth=2)
    result = await delegate(registry, goal="top", toolsets=["delegation", "terminal"])
    assert result == "top answer"
    level1, level1_again, level2, level1_last = fake.requests
    assert offered(level1) == ["delegate_task", "terminal"]
    assert "cannot delegate further" in tool_messages(level1_again)[0]["content"]
    assert offered(level2) == ["terminal"]
    assert level2["body"]["messages"][1]["content"] == "Goal: deeper"
    assert tool_messages(level1_last)[-1]["content"] == "deep answer"


async def test_a_denied_command_is_a_tool_error_for_the_subagent(fake, real_runtime, tmp_path):
    denied_marker = tmp_path / "denied"
    approved_marker = tmp_path / "approved"
    asked: list[tuple[str, threading.Thread, asyncio.AbstractEventLoop]] = []

    async def confirm(command: str) -> bool:
        # Called on the loop of the turn that dispatched (the server's), not the sub-agent's.
        asked.append((command, threading.current_thread(), asyncio.get_running_loop()))
        return "approved" in command

    ctx = ToolContext(session_id="web-1", origin_ui_session_id="web-1", confirm=confirm)
    fake.script = [
        completion(None, [tool_call("c1", "terminal", command=f"touch {denied_marker}")]),
        completion(None, [tool_call("c2", "terminal", command=f"touch {approved_marker}")]),
        completion("The first was denied; the second ran."),
    ]
    handle = await delegate(registry_for(fake, tmp_path), ctx, goal="touch", background=True)
    evt = await completion_of(real_runtime, handle)

    assert evt["status"] == "completed"
    assert evt["summary"] == "The first was denied; the second ran."
    assert [command for command, _, _ in asked] == [
        f"touch {denied_marker}",
        f"touch {approved_marker}",
    ]
    this_loop = asyncio.get_running_loop()
    assert all(thread is threading.main_thread() for _, thread, _ in asked)
    assert all(loop is this_loop for _, _, loop in asked)
    denial = json.loads(tool_messages(fake.requests[1])[0]["content"])
    assert denial == {"error": DENIED_ERROR, "denied": True}
    assert not denied_marker.exists()
    assert approved_marker.exists()
    assert evt["tools_used"] == [{"name": "terminal", "calls": 2}]


async def test_an_approval_waiting_past_the_stall_limit_is_withdrawn(fake, tmp_path):
    withdrawn = asyncio.Event()

    async def confirm(command: str) -> bool:
        try:
            await asyncio.sleep(60)  # nobody answers
        except asyncio.CancelledError:
            withdrawn.set()
            raise
        return True

    marker = tmp_path / "never"
    fake.script = [completion(None, [tool_call("c1", "terminal", command=f"touch {marker}")])]
    ctx = ToolContext(session_id="web-2", confirm=confirm)
    result = await delegate(registry_for(fake, tmp_path, stall_seconds=1.0), ctx, goal="g")
    assert "while running the tool terminal" in result["error"]
    await asyncio.wait_for(withdrawn.wait(), 10)  # the question was withdrawn on this loop
    assert not marker.exists()


async def test_the_step_limit_ends_it_completed_with_what_it_had(fake, real_runtime, tmp_path):
    fake.script = [
        completion(None, [tool_call(f"c{i}", "terminal", command=f"echo step-{i}")])
        for i in range(3)
    ]
    registry = registry_for(fake, tmp_path, max_steps=2)
    handle = await delegate(registry, goal="loop forever", background=True)
    evt = await completion_of(real_runtime, handle)

    assert evt["status"] == "completed"
    assert evt["step_limit_reached"] is True
    assert "step limit (2 steps)" in evt["summary"]
    assert "step-0" in evt["summary"] and "step-1" in evt["summary"]
    assert evt["tools_used"] == [{"name": "terminal", "calls": 2}]
    assert len(fake.requests) == 2


async def test_a_failing_model_fails_the_subagent_with_what_it_had(fake, real_runtime, tmp_path):
    from tests.agent.test_openai_compat import error

    fake.script = [
        completion(None, [tool_call("c1", "terminal", command="echo got-this-far")]),
        error(500, "upstream broke"),
    ]
    handle = await delegate(registry_for(fake, tmp_path), goal="g", background=True)
    evt = await completion_of(real_runtime, handle)
    assert evt["status"] == "failed"
    assert "upstream broke" in evt["error"]
    assert "got-this-far" in evt["summary"]
    assert evt["tools_used"] == [{"name": "terminal", "calls": 1}]


def routed(main: list[Any], sub: list[Any]) -> Any:
    """One handler for every call: a sub-agent's calls (its system message carries the
    marker) and the conversation's run concurrently, so each takes its own script."""

    async def handler(request: Any, body: dict[str, Any]) -> Any:
        first = body["messages"][0]
        is_sub = first["role"] == "system" and SUBAGENT_MARKER in str(first["content"])
        return await (sub if is_sub else main).pop(0)(request, body)

    return handler


async def test_end_to_end_a_provider_turn_delegates_in_the_background_through_the_api(
    fake, tmp_path
):
    """A real `reveille serve` on the fake model: the turn calls delegate_task(background),
    the sub-agent runs the shell twice, and its result lands in the API session's
    transcript saying which tools it used."""
    from tests.api_server.serve_support import Server, chat, ledger_rows, transcript, wait_until

    main = [
        completion(None, [tool_call("m1", "delegate_task", goal="count", background=True)]),
        completion("Started; the result will come back here."),
    ]
    sub = [
        completion(None, [tool_call("s1", "terminal", command="echo alpha")]),
        completion(None, [tool_call("s2", "terminal", command="echo beta")]),
        completion("Counted: alpha, beta."),
    ]
    fake.script = [routed(main, sub)] * (len(main) + len(sub))
    env = {
        "REVEILLE_PROVIDER": "openai",
        "REVEILLE_MODEL": "fake-model",
        "OPENAI_BASE_URL": fake.base_url,
        "OPENAI_API_KEY": "sk-test",
    }
    server = await asyncio.to_thread(Server, tmp_path / "home", extra_env=env)
    try:
        session_id, reply = await asyncio.to_thread(
            chat, server.port, "count for me", model="fake-model"
        )
        assert reply == "Started; the result will come back here."

        def delivered() -> list[dict[str, Any]]:
            rows = transcript(server.port, session_id)
            return [r for r in rows if r.get("display_kind") == "async_delegation_complete"]

        (row,) = await asyncio.to_thread(wait_until, delivered)
        assert "Counted: alpha, beta." in row["content"]
        assert "Tools used: terminal (2 calls)" in row["content"]
        (ledger_row,) = await asyncio.to_thread(ledger_rows, tmp_path / "home")
        assert ledger_row.state == "completed"
        assert ledger_row.event["tools_used"] == [{"name": "terminal", "calls": 2}]
        sub_calls = [r for r in fake.requests if SUBAGENT_MARKER in json.dumps(r["body"])]
        assert len(sub_calls) == 3
        assert offered(sub_calls[0]) == ["terminal"]
        outputs = [json.loads(m["content"])["output"] for m in tool_messages(sub_calls[2])]
        assert outputs == ["alpha\n", "beta\n"]
        assert await asyncio.to_thread(server.stop) == 0
    finally:
        if server.proc.poll() is None:
            server.proc.kill()


async def test_a_confirmation_hook_whose_server_loop_is_gone_denies():
    asked: list[str] = []

    async def confirm(command: str) -> bool:
        asked.append(command)
        return True

    gone = asyncio.new_event_loop()
    gone.close()
    ctx = ToolContext(session_id="s", confirm=confirm).on_loop(gone)
    assert ctx.confirm is not None
    assert await ctx.confirm("rm -rf /tmp/x") is False
    assert asked == []
    # Handed further down (a sub-agent's sub-agent), a hook keeps its own loop.
    assert ctx.on_loop(asyncio.get_running_loop()).confirm is ctx.confirm


async def _pid_once_written(pid_file: Path) -> int:
    deadline = time.monotonic() + 20
    while not (pid_file.exists() and pid_file.read_text().strip()):
        assert time.monotonic() < deadline, "the command never started"
        await asyncio.sleep(0.05)
    return int(pid_file.read_text())


async def _gone(pid: int) -> bool:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        await asyncio.sleep(0.05)
    return False


async def test_cancelling_a_background_subagent_stops_it_and_its_command(
    fake, real_runtime, tmp_path
):
    pid_file = tmp_path / "pid"
    fake.script = [
        completion(None, [tool_call("c1", "terminal", command=f"echo $$ > {pid_file}; sleep 60")])
    ]
    handle = await delegate(registry_for(fake, tmp_path), goal="wait", background=True)
    pid = await _pid_once_written(pid_file)
    assert real_runtime[0].cancel_delegation(handle["delegation_id"])
    evt = await completion_of(real_runtime, handle)

    assert evt["status"] == "cancelled"
    assert "(still running when it stopped)" in evt["summary"]
    assert evt["tools_used"] == [{"name": "terminal", "calls": 1}]
    assert await _gone(pid)
    assert len(fake.requests) == 1


async def test_stopping_the_turn_stops_the_inline_subagent_it_waits_for(fake, tmp_path):
    pid_file = tmp_path / "pid"
    fake.script = [
        completion(None, [tool_call("c1", "terminal", command=f"echo $$ > {pid_file}; sleep 60")])
    ]
    turn = asyncio.ensure_future(delegate(registry_for(fake, tmp_path), goal="wait"))
    pid = await _pid_once_written(pid_file)
    turn.cancel()
    with pytest.raises(asyncio.CancelledError):
        await turn
    assert await _gone(pid)


async def test_web_ui_approvals_gate_a_subagent_like_its_parent(fake, real_runtime, tmp_path):
    """The real web UI approvals: an inline sub-agent asks in the turn that holds the
    session and the tab answers; once no turn holds it, a background sub-agent still asks,
    as its unit (no session held), and the tab's answer lets its command run."""
    from api.approvals import Approvals
    from gateway.session import SessionStore
    from tests.stores import memory_sessions

    store = SessionStore(memory_sessions())
    make_session(store, "s1")
    store.take_turn("s1", "st_1")
    answers = iter([False, True, True])
    asked: list[Any] = []
    deciding: list[asyncio.Task[Any]] = []

    async def tab(approval: Any) -> None:
        if approval.status == "pending":
            asked.append(approval)
            # Answered as a tab would, after the question was announced.
            decide = approvals.decide(approval.id, next(answers))
            deciding.append(asyncio.get_running_loop().create_task(decide))

    approvals = Approvals(store)
    approvals.listen(tab)
    ctx = ToolContext(
        session_id="s1",
        origin_ui_session_id="s1",
        confirm=approvals.confirm_for("s1"),
        confirm_unit=approvals.confirm_unit_for("s1"),
    )
    denied, approved, later = tmp_path / "denied", tmp_path / "approved", tmp_path / "later"
    fake.script = [
        completion(None, [tool_call("c1", "terminal", command=f"touch {denied}")]),
        completion(None, [tool_call("c2", "terminal", command=f"touch {approved}")]),
        completion("One was denied, one ran."),
    ]
    registry = registry_for(fake, tmp_path)
    assert await delegate(registry, ctx, goal="touch both") == "One was denied, one ran."
    assert [a.command for a in asked] == [f"touch {denied}", f"touch {approved}"]
    assert not any(a.background for a in asked)
    assert not denied.exists() and approved.exists()

    assert store.end_turn("s1", "st_1")  # the turn is over; its background work goes on
    fake.script = [
        completion(None, [tool_call("c3", "terminal", command=f"touch {later}")]),
        completion("It ran."),
    ]
    handle = await delegate(registry, ctx, goal="g", background=True)
    evt = await completion_of(real_runtime, handle)
    assert evt["summary"] == "It ran." and later.exists()
    unit_asked = asked[-1]
    assert unit_asked.unit_id == handle["delegation_id"] and unit_asked.stream_id == ""
    assert store.get_approval(unit_asked.id).status == "approved"
    assert store.running_turns() == {}  # nothing held the session meanwhile


async def test_an_unanswered_background_approval_expires_and_does_not_stall(
    fake, real_runtime, tmp_path
):
    """Nobody answers: past ``approval_timeout`` the unit is told "expired" (not "denied"),
    the conversation gets one notice, and the wait never tripped the (shorter) stall limit."""
    from gateway.approvals import EXPIRED_DISPLAY_KIND, Approvals
    from gateway.session import SessionStore
    from tests.stores import memory_sessions
    from tools.shell_tool import EXPIRED_ERROR

    store = SessionStore(memory_sessions())
    make_session(store, "s2")
    approvals = Approvals(store, poll_seconds=0.2, timeout_seconds=2.0)
    ctx = ToolContext(
        session_id="s2",
        confirm=approvals.confirm_for("s2"),
        confirm_unit=approvals.confirm_unit_for("s2"),
    )
    never = tmp_path / "never"
    fake.script = [
        completion(None, [tool_call("c1", "terminal", command=f"touch {never}")]),
        completion("Nobody answered, so it did not run."),
    ]
    registry = registry_for(fake, tmp_path, stall_seconds=0.5)
    evt = await completion_of(
        real_runtime, await delegate(registry, ctx, goal="g", background=True)
    )
    assert evt["status"] == "completed", evt
    told = json.loads(tool_messages(fake.requests[-1])[0]["content"])
    assert told == {"error": EXPIRED_ERROR, "expired": True}
    assert "denied" not in told and not never.exists()
    notices = [m for m in store.messages("s2") if m.display_kind == EXPIRED_DISPLAY_KIND]
    assert len(notices) == 1 and f"touch {never}" in notices[0].content


async def test_cancelling_a_unit_that_waits_for_approval_withdraws_it(fake, real_runtime, tmp_path):
    """A unit stopped while it waits: its approval is settled (nobody can answer for it any
    more), never left pending, and its command never runs."""
    from gateway.approvals import Approvals
    from gateway.session import SessionStore
    from tests.stores import memory_sessions

    store = SessionStore(memory_sessions())
    make_session(store, "s3")
    approvals = Approvals(store, poll_seconds=0.1)
    ctx = ToolContext(
        session_id="s3",
        confirm=approvals.confirm_for("s3"),
        confirm_unit=approvals.confirm_unit_for("s3"),
    )
    never = tmp_path / "never"
    fake.script = [completion(None, [tool_call("c1", "terminal", command=f"touch {never}")])]
    handle = await delegate(registry_for(fake, tmp_path), ctx, goal="g", background=True)
    while not store.pending_unit_approvals():
        await asyncio.sleep(0.02)
    (asked,) = store.pending_unit_approvals()
    assert asked.unit_id == handle["delegation_id"]
    assert real_runtime[0].cancel_delegation(handle["delegation_id"])
    evt = await completion_of(real_runtime, handle)
    assert evt["status"] == "cancelled"
    assert store.get_approval(asked.id).status == "expired"
    assert store.pending_unit_approvals() == [] and not never.exists()
