"""A fake OpenAI-compatible model for the ecosystem tests and the Open Responses checks,
and a real `reveille serve` on top of it.

The model is a real aiohttp server on loopback (``FakeOpenAI``) running in a thread of its
own, so synchronous clients (a LangChain agent's ``invoke``, the ``openai`` client) and
asynchronous ones can both drive the `reveille serve` subprocess that calls it. It answers
like an agent model would: asked about the weather while a client tool ``get_weather`` is
offered, it calls that tool (and, when asked to work "in the background", ``delegate_task``
with ``background: true`` in the same step); given the tool's result, it answers with it.
It streams (text and tool-call deltas) when asked to, and records every request.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aiohttp import web

from agent.markers import SUBAGENT_MARKER, SUMMARISE_MARKER
from tests.agent.test_openai_compat import FakeOpenAI, _chunk
from tests.api_server.serve_support import Server

MODEL = "fake-model"
CLIENT_TOOL = "get_weather"
SUB_AGENT_ANSWER = "The sky holds 42 stars tonight."
SUMMARY = "Summary: the user talked about the weather."
USAGE = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}


def _text(content: Any) -> str:
    """The text of a chat message's content (a string, or text and image parts)."""
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content or "")


def _offered(body: dict[str, Any]) -> set[str]:
    return {str(tool.get("function", {}).get("name")) for tool in body.get("tools") or []}


class AgentModel:
    """The fake model's behaviour: one handler for every chat-completions request."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self._ids = itertools.count(1)
        self.client_calls: set[str] = set()  # ids of the client tool calls it made
        self.answered: set[str] = set()  # of those, the ones whose result it answered

    async def __call__(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        self.requests.append(body)
        content, calls = self._decide(body)
        if body.get("stream"):
            return await self._stream(request, content, calls)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        choice = {
            "index": 0,
            "message": message,
            "finish_reason": "tool_calls" if calls else "stop",
        }
        return web.json_response(
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "created": 1,
                "model": MODEL,
                "choices": [choice],
                "usage": USAGE,
            }
        )

    def _decide(self, body: dict[str, Any]) -> tuple[str | None, list[dict[str, Any]]]:
        messages: list[dict[str, Any]] = body["messages"]
        first = _text(messages[0].get("content")) if messages else ""
        if SUBAGENT_MARKER in first:
            return SUB_AGENT_ANSWER, []
        if any(SUMMARISE_MARKER in _text(m.get("content")) for m in messages[:1]):
            return SUMMARY, []
        results = [
            m
            for m in messages
            if m.get("role") == "tool"
            and m.get("tool_call_id") in self.client_calls - self.answered
        ]
        if results:
            self.answered.update(str(m["tool_call_id"]) for m in results)
            said = "; ".join(_text(m.get("content")) for m in results)
            return f"The weather in San Francisco: {said}.", []
        users = [_text(m.get("content")) for m in messages if m.get("role") == "user"]
        asked = users[-1] if users else ""
        offered = _offered(body)
        if "weather" in asked.lower() and CLIENT_TOOL in offered:
            calls = []
            if "background" in asked.lower() and "delegate_task" in offered:
                goal = {"goal": "count the stars", "background": True}
                calls.append(self._call("delegate_task", goal))
            weather = self._call(CLIENT_TOOL, {"location": "San Francisco, CA"})
            self.client_calls.add(weather["id"])
            return None, [*calls, weather]
        if any(m.get("role") == "system" and "pirate" in _text(m.get("content")) for m in messages):
            return "Ahoy, matey!", []
        if "name" in asked.lower() and any("Alice" in u for u in users[:-1]):
            return "Your name is Alice.", []
        return "Hello there, friend.", []

    def _call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": f"call_{name}_{next(self._ids)}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)},
        }

    async def _stream(
        self, request: web.Request, content: str | None, calls: list[dict[str, Any]]
    ) -> web.StreamResponse:
        chunks = [_chunk({"role": "assistant", "content": ""})]
        words = (content or "").split(" ")
        chunks += [_chunk({"content": w if i == 0 else f" {w}"}) for i, w in enumerate(words) if w]
        for index, call in enumerate(calls):
            name = call["function"]["name"]
            head = {"id": call["id"], "type": "function", "function": {"name": name}}
            chunks.append(_chunk({"tool_calls": [{"index": index, **head}]}))
            arguments = call["function"]["arguments"]
            half = len(arguments) // 2
            for piece in (arguments[:half], arguments[half:]):
                delta = {"index": index, "function": {"arguments": piece}}
                chunks.append(_chunk({"tool_calls": [delta]}))
        chunks.append(_chunk({}, finish_reason="tool_calls" if calls else "stop"))
        chunks.append(_chunk({}, usage=USAGE, choices=False))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for payload in chunks:
            await response.write(f"data: {json.dumps(payload)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


class ThreadedModel:
    """``FakeOpenAI`` answering with an ``AgentModel``, on an event loop in its own thread."""

    def __init__(self) -> None:
        self.model = AgentModel()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.fake = FakeOpenAI()
        self.fake.default = self.model
        asyncio.run_coroutine_threadsafe(self.fake.start(), self._loop).result(30)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.fake.stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()


def serve_on(model: ThreadedModel, home: Path, **env: str) -> Server:
    """A `reveille serve` subprocess whose model is ``model`` (state in ``home``)."""
    extra = {
        "REVEILLE_PROVIDER": "openai",
        "REVEILLE_MODEL": MODEL,
        "OPENAI_BASE_URL": model.fake.base_url,
        "OPENAI_API_KEY": "sk-fake",
        **env,
    }
    return Server(home, extra_env=extra)


def serving(home: Path) -> Iterator[tuple[Server, ThreadedModel]]:
    """A generator for fixtures: the fake model and a server on it, both stopped after."""
    model = ThreadedModel()
    try:
        server = serve_on(model, home)
        try:
            yield server, model
        finally:
            assert server.stop() == 0, "".join(server.lines)
    finally:
        model.close()
