"""`reveille serve` with Telegram, the fake Bot API and a fake OpenAI-compatible model: the
conversation delegates, and its background sub-agent's command is asked in the chat with
Approve/Deny buttons after the turn ended. Someone else's press is refused; the owner's
approves it once; the command runs and the sub-agent's result comes home once, as the
chat's wake-up. Unanswered, the chat is told once that it expired."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agent.markers import SUBAGENT_MARKER
from tests.agent.test_openai_compat import FakeOpenAI, _chunk, sse
from tests.agent.test_openai_compat import completion as json_completion
from tests.agent.test_subagent_tools import routed, tool_call, tool_messages
from tests.api_server.serve_support import Server, wait_until
from tests.telegram.conftest import serve
from tests.telegram.fake_bot_api import FakeBotApi
from tests.telegram.test_serve_approvals import data, keyboard


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    server = FakeOpenAI()
    await server.start()
    yield server
    await server.stop()


def _env(fake: FakeOpenAI, **extra: str) -> dict[str, str]:
    return {
        "REVEILLE_PROVIDER": "openai",
        "REVEILLE_MODEL": "fake-model",
        "OPENAI_BASE_URL": fake.base_url,
        "OPENAI_API_KEY": "sk-test",
        "REVEILLE_SHELL_APPROVALS": "always",
        **extra,
    }


def completion(content: str | None, tool_calls: list[dict[str, Any]] | None = None) -> Any:
    """One answer, streamed when the call streams (Telegram's turns edit as text arrives)."""
    plain = json_completion(content, tool_calls)

    async def handler(request: Any, body: dict[str, Any]) -> Any:
        if not body.get("stream"):
            return await plain(request, body)
        delta: dict[str, Any] = {"role": "assistant", "content": content or ""}
        if tool_calls:
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(tool_calls)]
        finish = "tool_calls" if tool_calls else "stop"
        return await sse(_chunk(delta), _chunk({}, finish_reason=finish))(request, body)

    return handler


def _script(fake: FakeOpenAI, command: str, summary: str) -> None:
    main = [
        completion(None, [tool_call("m1", "delegate_task", goal="run it", background=True)]),
        completion("Started in the background."),
        completion("The background task reported back."),  # the wake-up turn
    ]
    sub = [completion(None, [tool_call("s1", "terminal", command=command)]), completion(summary)]
    fake.script = [routed(main, sub)] * (len(main) + len(sub))


def _sub_results(fake: FakeOpenAI) -> list[dict[str, Any]]:
    calls = [r for r in fake.requests if SUBAGENT_MARKER in json.dumps(r["body"]["messages"][0])]
    return [json.loads(m["content"]) for m in tool_messages(calls[-1])]


def _main_calls_with(fake: FakeOpenAI, text: str) -> list[dict[str, Any]]:
    main = [r for r in fake.requests if SUBAGENT_MARKER not in json.dumps(r["body"]["messages"][0])]
    return [r for r in main if text in json.dumps(r["body"]["messages"][-1])]


async def _started(tmp_path: Path, bot: FakeBotApi, env: dict[str, str]) -> Server:
    server = await asyncio.to_thread(serve, tmp_path, bot, **env)
    bot.message("run it in the background")
    await asyncio.to_thread(
        wait_until, lambda: "Started in the background." in bot.texts_to(42), 30
    )
    return server


async def test_the_owner_approves_a_background_command_with_the_buttons(
    fake: FakeOpenAI, tmp_path: Path, bot: FakeBotApi
) -> None:
    _script(fake, "echo tg-output", "It printed tg-output.")
    server = await _started(tmp_path, bot, _env(fake))
    try:
        asked = await asyncio.to_thread(keyboard, bot, set())
        assert "background task" in asked.text and "echo tg-output" in asked.text
        # Another allowed user of the bot does not own this chat: refused, nothing decided.
        bot.press(asked.message_id, data(asked, "Approve once"), user_id=43, chat_id=42)
        await asyncio.to_thread(wait_until, lambda: bot.answers(), 30)
        assert bot.answers() == ["Not yours to decide."]
        assert _sub_results_or_none(fake) is None
        bot.press(asked.message_id, data(asked, "Approve once"), user_id=42)
        await asyncio.to_thread(wait_until, lambda: len(bot.answers()) == 2, 30)
        assert bot.answers()[-1] == "Approved."
        # The command ran; the sub-agent's result came home as the chat's wake-up, once.
        await asyncio.to_thread(
            wait_until,
            lambda: "The background task reported back." in bot.texts_to(42),
            30,
        )
        (result,) = _sub_results(fake)
        assert result["output"] == "tg-output\n"
        assert len(_main_calls_with(fake, "It printed tg-output.")) == 1
        await asyncio.sleep(1.0)
        assert bot.texts_to(42).count("The background task reported back.") == 1
        log = "".join(server.lines)
        assert "approved by Telegram user 42" in log
    finally:
        await asyncio.to_thread(server.stop)


def _sub_results_or_none(fake: FakeOpenAI) -> list[dict[str, Any]] | None:
    calls = [r for r in fake.requests if SUBAGENT_MARKER in json.dumps(r["body"]["messages"][0])]
    return None if len(calls) < 2 else _sub_results(fake)


async def test_an_unanswered_background_command_expires_with_one_message(
    fake: FakeOpenAI, tmp_path: Path, bot: FakeBotApi
) -> None:
    _script(fake, "echo never", "Nobody answered.")
    env = _env(fake, REVEILLE_SHELL_APPROVAL_TIMEOUT="2")
    server = await _started(tmp_path, bot, env)
    try:
        asked = await asyncio.to_thread(keyboard, bot, set())
        await asyncio.to_thread(
            wait_until, lambda: "The background task reported back." in bot.texts_to(42), 30
        )
        (told,) = _sub_results(fake)
        assert told["expired"] is True and "denied" not in told
        expired = [t for t in bot.texts_to(42) if "Approval expired" in t]
        assert len(expired) == 1 and "echo never" in expired[0]
        # A late press is told it expired.
        bot.press(asked.message_id, data(asked, "Approve once"), user_id=42)
        await asyncio.to_thread(wait_until, lambda: bot.answers(), 30)
        assert bot.answers()[-1].startswith("Expired")
        await asyncio.to_thread(server.wait_for, re.compile(r"expired \(nobody answered in time\)"))
    finally:
        await asyncio.to_thread(server.stop)
