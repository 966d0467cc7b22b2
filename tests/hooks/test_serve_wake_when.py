"""`wake_when` through a real `reveille serve`, its model a scripted OpenAI-compatible server
(the only thing faked: the model provider, as a real server).

- A wait set before its event: a non-matching event does nothing; the matching one wakes
  the conversation once (a transcript row ``display_kind = "inbound_event"``, outcome
  ``matched``), and a later matching event never again.
- A wait set after its event arrived fires at once (the lookback): the tool says so, and
  the conversation gets the wake-up.
- A wait nothing matches expires with an ``expired`` wake-up when its lifetime ends.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.wake import INBOUND_DISPLAY_KIND
from tests.agent.test_openai_compat import FakeOpenAI, completion
from tests.agent.test_subagent_tools import tool_call
from tests.api_server.serve_support import Server, chat, transcript, wait_until
from tests.hooks.test_serve_hooks import _post, _reveille


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    server = FakeOpenAI()
    await server.start()
    yield server
    await server.stop()


def _inbound(port: int, session_id: str) -> list[dict[str, Any]]:
    return [m for m in transcript(port, session_id) if m["display_kind"] == INBOUND_DISPLAY_KIND]


def _tool_results(fake: FakeOpenAI) -> list[dict[str, Any]]:
    return [
        json.loads(m["content"])
        for r in fake.requests
        for m in r["body"]["messages"]
        if m.get("role") == "tool"
    ]


async def test_wake_when_fires_once_on_arrival_or_by_looking_back(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text("[hooks.ci]\n")
    made = await asyncio.to_thread(_reveille, home, "hooks", "secret", "ci")
    secret = made.stdout.strip()
    wait_green = tool_call(
        "w1", "wake_when", hook="ci", path="build.status", equals="green", note="say it is green"
    )
    wait_deployed = tool_call("w2", "wake_when", hook="ci", contains="deployed", note="announce")
    wait_never = tool_call(
        "w3", "wake_when", hook="ci", contains="rollback", note="check", lifetime_seconds=10
    )
    fake.script = [
        completion(None, [wait_green]),
        completion("I will tell you when it is green."),
        completion(None, [wait_deployed]),
        completion("It was deployed already."),
        completion(None, [wait_never]),
        completion("I will watch for a rollback."),
    ]
    env = {
        "REVEILLE_PROVIDER": "openai",
        "REVEILLE_MODEL": "fake-model",
        "OPENAI_BASE_URL": fake.base_url,
        "OPENAI_API_KEY": "sk-test",
    }
    server = await asyncio.to_thread(Server, home, extra_env=env)
    try:
        session_id, reply = await asyncio.to_thread(
            chat, server.port, "tell me when the build is green", model="fake-model"
        )
        assert reply == "I will tell you when it is green."
        [waiting] = _tool_results(fake)
        assert waiting["status"] == "waiting", waiting
        assert (
            await asyncio.to_thread(_post, server.port, secret, "m1", {"build": {"status": "red"}})
            == 200
        )
        assert (
            await asyncio.to_thread(
                _post, server.port, secret, "m2", {"build": {"status": "green"}}
            )
            == 200
        )
        (row,) = await asyncio.to_thread(wait_until, lambda: _inbound(server.port, session_id))
        assert row["display_metadata"]["outcome"] == "matched"
        assert row["display_metadata"]["webhook_id"] == "m2" and "say it is green" in row["content"]

        # A wait set after its event: the event came first, the wait finds it.
        assert (
            await asyncio.to_thread(_post, server.port, secret, "m3", {"msg": "v2 deployed"}) == 200
        )
        _, reply = await asyncio.to_thread(
            chat, server.port, "was it deployed?", session_id, model="fake-model"
        )
        assert reply == "It was deployed already."
        fired = _tool_results(fake)[-1]
        assert fired["status"] == "fired" and fired["event_id"] == "m3", fired
        rows = await asyncio.to_thread(
            wait_until, lambda: (r := _inbound(server.port, session_id)) and len(r) >= 2 and r
        )
        assert [r["display_metadata"]["webhook_id"] for r in rows] == ["m2", "m3"]
        # Never twice: another green event and a re-post change nothing.
        assert (
            await asyncio.to_thread(
                _post, server.port, secret, "m4", {"build": {"status": "green"}}
            )
            == 200
        )
        assert (
            await asyncio.to_thread(
                _post, server.port, secret, "m2", {"build": {"status": "green"}}
            )
            == 200
        )
        await asyncio.sleep(1.0)
        assert len(await asyncio.to_thread(_inbound, server.port, session_id)) == 2

        # A wait nothing matches expires visibly: the conversation is told, never silence.
        _, reply = await asyncio.to_thread(
            chat, server.port, "tell me if it rolls back", session_id, model="fake-model"
        )
        assert reply == "I will watch for a rollback."
        rows = await asyncio.to_thread(
            wait_until, lambda: (r := _inbound(server.port, session_id)) and len(r) >= 3 and r, 40
        )
        assert rows[-1]["display_metadata"]["outcome"] == "expired"
        assert "no matching event came" in rows[-1]["content"]
    finally:
        await asyncio.to_thread(server.stop)
