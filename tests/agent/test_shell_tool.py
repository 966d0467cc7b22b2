"""The `terminal` tool: off means nothing runs; foreground runs for real; background spawns."""

from __future__ import annotations

import json
import sys
import time
import types

import pytest

from agent.tools import ToolContext, ToolRegistry
from tools.shell_tool import OUTPUT_TAIL_BYTES, SHELL_DISABLED_ERROR, make_shell_tool

CTX = ToolContext(
    session_id="api-sess-1", session_key="agent:main:api:dm:1", origin_ui_session_id="ui-1"
)


async def _call(tool, **args):
    return json.loads(await ToolRegistry([tool]).call("terminal", json.dumps(args), CTX))


@pytest.mark.parametrize("background", [False, True])
async def test_disabled_shell_runs_nothing_and_says_how_to_enable_it(tmp_path, background):
    marker = tmp_path / "marker"
    tool = make_shell_tool(enabled=False, workdir=str(tmp_path))
    result = await _call(tool, command=f"touch {marker}", background=background)
    assert result == {"error": SHELL_DISABLED_ERROR}
    assert "REVEILLE_SHELL_ENABLED=1" in result["error"]
    assert "shell.enabled" in result["error"]
    time.sleep(0.2)  # a background spawn would have had time to create it
    assert not marker.exists()


async def test_foreground_runs_for_real_in_the_workdir(tmp_path):
    tool = make_shell_tool(enabled=True, workdir=str(tmp_path))
    result = await _call(tool, command="echo hello; echo oops >&2; touch made; pwd; exit 3")
    assert result["exit_code"] == 3
    assert result["output"].splitlines() == ["hello", "oops", str(tmp_path)]
    assert result["truncated"] is False
    assert "timed_out" not in result
    assert (tmp_path / "made").exists()


async def test_foreground_output_is_bounded_to_the_last_16_kib(tmp_path):
    tool = make_shell_tool(enabled=True, workdir=str(tmp_path))
    script = "import sys; sys.stdout.write('a' * 100000 + 'THE END')"
    result = await _call(tool, command=f'{sys.executable} -c "{script}"')
    assert result["exit_code"] == 0
    assert result["truncated"] is True
    assert len(result["output"].encode()) == OUTPUT_TAIL_BYTES
    assert result["output"].endswith("aTHE END")


async def test_foreground_timeout_kills_the_whole_command(tmp_path):
    tool = make_shell_tool(enabled=True, workdir=str(tmp_path), timeout_seconds=0.5)
    started = time.monotonic()
    result = await _call(tool, command="echo started; sleep 30; touch late")
    assert time.monotonic() - started < 5
    assert result["timed_out"] is True
    assert "timed out after 0.5 s" in result["error"]
    assert result["output"] == "started\n"
    time.sleep(0.2)
    assert not (tmp_path / "late").exists()


async def test_empty_command_is_refused(tmp_path):
    tool = make_shell_tool(enabled=True, workdir=str(tmp_path))
    assert await _call(tool, command="   ") == {"error": "command must not be empty"}


async def test_background_passes_the_origin_to_the_process_registry(monkeypatch, tmp_path):
    calls = []

    class FakeRegistry:
        def spawn(self, command, **kwargs):
            calls.append((command, kwargs))
            return {"process_id": "proc_feed", "pid": 123, "status": "running"}

    fake_module = types.ModuleType("tools.process_registry")
    fake_module.process_registry = FakeRegistry()
    monkeypatch.setitem(sys.modules, "tools.process_registry", fake_module)

    tool = make_shell_tool(enabled=True, workdir=str(tmp_path))
    result = await _call(tool, command="make all", background=True, notify_on_complete="true")
    assert result == {"process_id": "proc_feed", "pid": 123, "status": "running"}
    assert calls == [
        (
            "make all",
            {
                "cwd": str(tmp_path),
                "session_key": "agent:main:api:dm:1",
                "origin_session_id": "api-sess-1",
                "origin_ui_session_id": "ui-1",
                "notify_on_complete": True,
            },
        )
    ]


def _wait_for_event(queue, key, value, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        evt = queue.get(timeout=max(0.01, deadline - time.monotonic()))
        if evt.get(key) == value:
            return evt
    raise AssertionError(f"no completion event with {key}={value}")


async def test_background_spawns_a_real_process_that_reports_back(real_runtime, tmp_path):
    _, registry = real_runtime
    tool = make_shell_tool(enabled=True, workdir=str(tmp_path))
    result = await _call(
        tool,
        command="echo from-background; touch bg-done",
        background=True,
        notify_on_complete=True,
    )
    assert result["process_id"].startswith("proc_")
    assert isinstance(result["pid"], int)
    evt = _wait_for_event(registry.completion_queue, "process_id", result["process_id"])
    assert evt["exit_code"] == 0
    assert "from-background" in evt["output_tail"]
    assert evt["session_key"] == "agent:main:api:dm:1"
    assert evt["origin_session_id"] == "api-sess-1"
    assert evt["origin_ui_session_id"] == "ui-1"
    assert (tmp_path / "bg-done").exists()


async def test_background_writes_the_origin_session_before_spawning(monkeypatch, tmp_path):
    order: list[str] = []

    class FakeRegistry:
        def spawn(self, command, **kwargs):
            order.append("spawn")
            return {"process_id": "proc_feed", "pid": 123, "status": "running"}

    fake_module = types.ModuleType("tools.process_registry")
    fake_module.process_registry = FakeRegistry()
    monkeypatch.setitem(sys.modules, "tools.process_registry", fake_module)

    async def write_session() -> None:
        order.append("session written")

    ctx = ToolContext(session_id="api-sess-1", before_background=write_session)
    tool = make_shell_tool(enabled=True, workdir=str(tmp_path))
    await ToolRegistry([tool]).call(
        "terminal", json.dumps({"command": "x", "background": True}), ctx
    )
    assert order == ["session written", "spawn"]

    async def storage_down() -> None:
        raise RuntimeError("session store unavailable")

    order.clear()
    ctx = ToolContext(session_id="api-sess-1", before_background=storage_down)
    raw = await ToolRegistry([tool]).call(
        "terminal", json.dumps({"command": "x", "background": True}), ctx
    )
    assert order == []  # nothing started whose result would have nowhere to go
    assert "session store unavailable" in raw
