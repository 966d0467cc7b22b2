"""``sampling/createMessage`` from a real SDK server (``form_server.py`` over stdio), answered
by Reveille's model provider (the demo model): asked through the call's confirmation hook by
default (``sampling = "ask"``), at once with ``"allow"``, never offered with ``"deny"``, and
refused when nobody can approve it, a person says no, or the approval expires."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.providers.demo import DemoModel
from agent.tools import ApprovalExpired, ToolContext, ToolRegistry
from tools.mcp.config import McpConfigError, McpServerConfig, parse_servers
from tools.mcp.manager import McpClients

FORMS = Path(__file__).with_name("form_server.py")


def forms(**kwargs: object) -> McpServerConfig:
    return McpServerConfig(
        name="forms",
        command=(sys.executable, str(FORMS)),
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.fixture
async def clients() -> AsyncIterator[McpClients]:
    made = McpClients()
    yield made
    await made.stop()


async def ask_model(clients: McpClients, config: McpServerConfig, **ctx: object) -> str:
    await clients.start([config], min_backoff=0.05, model=DemoModel(delay_seconds=0))
    registry = ToolRegistry()
    clients.attach(registry)
    args = json.dumps({"prompt": "say hello to the server"})
    return await registry.call("forms__ask_model", args, ToolContext(**ctx))  # type: ignore[arg-type]


async def test_asked_then_answered_by_the_configured_model(clients) -> None:
    asked: list[str] = []

    async def confirm(text: str) -> bool:
        asked.append(text)
        return True

    answer = await ask_model(clients, forms(), confirm=confirm)
    assert answer.startswith("model reveille-demo (endTurn): ")
    assert "say hello to the server" in answer  # the demo model echoes what it was told
    assert asked == [
        "MCP server forms asks to use the model (at most 200 tokens): say hello to the server"
    ]


async def test_a_no_refuses_it(clients) -> None:
    async def confirm(text: str) -> bool:
        return False

    answer = await ask_model(clients, forms(), confirm=confirm)
    assert answer == "refused -1: the user rejected the sampling request"


async def test_an_expired_approval_refuses_it(clients) -> None:
    async def confirm(text: str) -> bool:
        raise ApprovalExpired("appr_x")

    answer = await ask_model(clients, forms(), confirm=confirm)
    assert answer == "refused -1: nobody approved the sampling request in time"


async def test_nobody_to_ask_refuses_it(clients) -> None:
    answer = await ask_model(clients, forms())
    assert answer == "refused -1: nobody could approve the sampling request"


async def test_allow_samples_without_asking(clients) -> None:
    async def confirm(text: str) -> bool:
        raise AssertionError("not asked")

    answer = await ask_model(clients, forms(sampling="allow"), confirm=confirm)
    assert answer.startswith("model reveille-demo (endTurn): ")


async def test_deny_does_not_offer_sampling(clients) -> None:
    answer = await ask_model(clients, forms(sampling="deny"))
    assert answer.startswith("refused ")
    assert "-1:" not in answer  # the SDK's own "not supported", not a refusal of ours


def test_sampling_setting_is_checked() -> None:
    table = {"servers": {"a": {"command": ["x"], "sampling": "allow"}}}
    (server,) = parse_servers(table, origin="config.toml", environ={})
    assert server.sampling == "allow"
    (default,) = parse_servers({"servers": {"a": {"command": ["x"]}}}, origin="c", environ={})
    assert default.sampling == "ask"
    bad = {"servers": {"a": {"command": ["x"], "sampling": "sometimes"}}}
    with pytest.raises(McpConfigError, match="sampling must be one of ask, allow, deny"):
        parse_servers(bad, origin="config.toml", environ={})
