"""The MCP client against real SDK servers (stdio subprocess, streamable HTTP on loopback):
namespaced tools in their toolset, include/exclude, ``tools/list_changed``, a crashed stdio
server restarted, a call past its timeout cancelled, error results, yes/no elicitation
through the confirmation hook, and a secret header that never reaches the logs."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.tools import ToolContext, ToolRegistry
from tests.api_server._support import poll
from tools.delegate_tool import subagent_toolsets
from tools.mcp.config import McpServerConfig
from tools.mcp.manager import McpClients

from ._support import http_echo, stdio_echo

TOKEN = "tok-7f3a9c-secret"


@pytest.fixture
async def clients() -> AsyncIterator[McpClients]:
    made = McpClients()
    yield made
    await made.stop()


async def started(clients: McpClients, *configs: McpServerConfig) -> ToolRegistry:
    await clients.start(configs, min_backoff=0.05)
    registry = ToolRegistry()
    clients.attach(registry)
    return registry


async def call(registry: ToolRegistry, name: str, args: object = None, **ctx: object) -> str:
    return await registry.call(name, json.dumps(args or {}), ToolContext(**ctx))  # type: ignore[arg-type]


async def test_tools_are_namespaced_in_their_toolset_and_globs_choose(clients) -> None:
    registry = await started(clients, stdio_echo(include=("s*", "p*"), exclude=("slow",)))
    assert registry.toolsets() == {"mcp:echo": ["echo__say", "echo__pid"]}
    tool = registry.get("echo__say")
    assert tool is not None and tool.parameters["required"] == ["text"]
    assert await call(registry, "echo__say", {"text": "hi"}) == "echo: hi"
    (status,) = clients.servers()
    assert (status.state, status.transport, status.tools) == (
        "ready",
        "stdio",
        ("echo__say", "echo__pid"),
    )


async def test_list_changed_refreshes_every_attached_registry(clients) -> None:
    registry = await started(clients, stdio_echo())
    other = ToolRegistry()
    clients.attach(other)
    assert "echo__double" not in registry
    assert await call(registry, "echo__grow") == "grown"
    await poll(lambda: "echo__double" in registry and "echo__double" in other)
    assert await call(other, "echo__double", {"x": 21}) == "42"


async def test_a_crashed_stdio_server_is_restarted(clients) -> None:
    registry = await started(clients, stdio_echo())
    first = await call(registry, "echo__pid")
    died = json.loads(await call(registry, "echo__die"))
    assert "Connection closed" in died["error"]
    connection = clients.connection("echo")
    assert connection is not None
    await poll(lambda: connection.restarts >= 1 and connection.state == "ready")
    second = await call(registry, "echo__pid")
    assert second.isdigit() and second != first


async def test_a_call_past_its_timeout_is_cancelled_and_the_agent_told(
    clients, tmp_path: Path
) -> None:
    marker = tmp_path / "cancelled"
    echo = stdio_echo(timeout_seconds=0.5, env={"ECHO_CANCELLED_FILE": str(marker)})
    registry = await started(clients, echo)
    result = json.loads(await call(registry, "echo__slow", {"seconds": 30}))
    assert "took longer than 0.5 s and was cancelled" in result["error"]
    # The server heard of it (notifications/cancelled) and stopped the work.
    await poll(marker.exists)
    # The session is still good for the next call.
    assert await call(registry, "echo__say", {"text": "after"}) == "echo: after"


async def test_an_error_result_is_an_error(clients) -> None:
    registry = await started(clients, stdio_echo())
    failed = json.loads(await call(registry, "echo__fail"))
    assert failed["error"].endswith("this tool always fails")


async def test_a_server_that_cannot_start_is_failed_with_its_reason(clients) -> None:
    registry = await started(clients, McpServerConfig(name="gone", command=("/nonexistent/x",)))
    (status,) = clients.servers()
    assert status.state == "failed" and len(registry) == 0
    assert "nonexistent" in status.last_error


async def test_a_failed_server_stays_failed_while_it_is_retried(clients, tmp_path: Path) -> None:
    # The first start exits at once; the retry hangs before it answers "initialize".
    tried = tmp_path / "tried"
    script = (
        "import pathlib, sys, time\n"
        f"p = pathlib.Path({str(tried)!r})\n"
        "if p.exists():\n    time.sleep(60)\n"
        "p.touch()\nsys.exit(1)\n"
    )
    config = McpServerConfig(name="flaky", command=(sys.executable, "-c", script))
    await started(clients, config)
    connection = clients.connection("flaky")
    assert connection is not None
    await poll(lambda: connection.restarts >= 1)
    (status,) = clients.servers()
    assert status.state == "failed" and status.last_error


async def test_approvals_and_questions_go_through_confirm(clients) -> None:
    registry = await started(clients, stdio_echo())
    asked: list[str] = []

    async def confirm(text: str) -> bool:
        asked.append(text)
        return not text.startswith("MCP echo__note")

    denied = json.loads(await call(registry, "echo__note", {"text": "x"}, confirm=confirm))
    assert denied["denied"] and asked == ['MCP echo__note {"text": "x"}']
    # Read-only: no approval (approvals = "unless_read_only"); its question is asked.
    answer = await call(registry, "echo__confirm", {"question": "go on?"}, confirm=confirm)
    assert answer == "answer: accept go=True"
    assert asked[-1] == "MCP server echo asks: go on?"
    # Nobody to ask: the write is refused, the question declined.
    refused = json.loads(await call(registry, "echo__note", {"text": "x"}))
    assert refused["denied"] and "cannot ask" in refused["error"]
    assert await call(registry, "echo__confirm", {"question": "?"}) == "answer: decline None"


async def test_http_server_with_a_secret_header_never_logged(
    clients, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ECHO_EXPECTED_TOKEN", TOKEN)
    caplog.set_level(logging.DEBUG)
    async with http_echo() as url:
        config = McpServerConfig(name="web", url=url, headers={"Authorization": f"Bearer {TOKEN}"})
        registry = await started(clients, config)
        assert clients.servers()[0].transport == "http"
        assert await call(registry, "web__say", {"text": "over http"}) == "echo: over http"
        assert await call(registry, "web__auth") == "authorized"
        await clients.stop()
    assert os.environ["ECHO_EXPECTED_TOKEN"] == TOKEN
    assert caplog.records and TOKEN not in caplog.text
    assert TOKEN not in repr(config)


async def test_a_sub_agent_gets_the_servers_toolset_by_name(clients) -> None:
    registry = await started(clients, stdio_echo(include=("say",)))
    assert subagent_toolsets(registry, ["mcp:echo"], may_delegate=False) == ["mcp:echo"]
    assert subagent_toolsets(registry, ["echo__say"], may_delegate=False) == ["mcp:echo"]
    assert "mcp:echo" in subagent_toolsets(registry, None, may_delegate=False)


def test_mcp_list_shows_servers_their_state_and_tools(tmp_path: Path) -> None:
    echo = stdio_echo()
    command = ", ".join(json.dumps(part) for part in echo.command)
    (tmp_path / "config.toml").write_text(
        f"""
[mcp.servers.echo]
command = [{command}]
include = ["say", "pid"]
env = {{ SECRET = "${{LIST_SECRET}}" }}

[mcp.servers.gone]
command = ["/nonexistent/server"]
"""
    )
    env = {**os.environ, "REVEILLE_HOME": str(tmp_path), "LIST_SECRET": TOKEN}
    env.pop("REVEILLE_CONFIG", None)
    listed = subprocess.run(
        [sys.executable, "-m", "reveille.cli", "mcp", "list", "--wait", "10"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 1, listed.stderr  # one server is not ready
    out = listed.stdout
    assert "echo (stdio): ready\n  toolset mcp:echo, 2 tool(s)\n  - echo__say\n  - echo__pid" in out
    assert "gone (stdio): failed - FileNotFoundError" in out
    assert TOKEN not in out and TOKEN not in listed.stderr
