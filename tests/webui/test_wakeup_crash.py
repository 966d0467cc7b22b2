"""A `reveille serve` SIGKILLed during a web UI wake-up turn delivers that wake-up exactly once
after a restart (issue 19).

Everything is real but the model: a web UI session asks for background work, the model (a
fake OpenAI-compatible server in this test process) answers with a ``delegate_task`` call,
the sub-agent answers with a result, and the result comes home as a wake-up turn whose reply
the model streams slowly. The server is SIGKILLed at one of several points of that turn and
started again on the same state directory, where the model answers promptly. The session
then holds exactly one wake-up card and one wake-up reply, and the next turn's model
context holds the result.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from agent.markers import SUBAGENT_MARKER, WAKE_MARKER
from tests.agent.test_openai_compat import FakeOpenAI, _chunk, _completion_body
from tests.api_server.serve_support import Server, ledger_rows, wait_until
from tests.ports import free_port
from tests.webui.conftest import Sse, WebClient

RESULT = "RESULT-7731: forty-two stars"  # the sub-agent's answer: only the wake text holds it
SLOW_REPLY = [f"slow{i} " for i in range(12)]  # the wake-up reply of the server that dies
PROMPT_REPLY = "The stars are counted."  # the wake-up reply after the restart
STEP_SECONDS = 0.15  # between two chunks of the slow reply

WakeHandler = Callable[[web.Request, dict[str, Any]], Awaitable[web.StreamResponse]]


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else json.dumps(content)


class Upstream(FakeOpenAI):
    """The model, answering each request by what it is (recorded in ``requests``):

    * the user's first question ("ASK-BG"): a ``delegate_task`` call in the background;
    * the turn going on after a tool result: a short acknowledgement;
    * the sub-agent (its system message carries SUBAGENT_MARKER): ``RESULT``;
    * a wake-up turn (the last message is a wake text): ``on_wake`` decides;
    * anything else (the follow-up question): a short answer.
    """

    def __init__(self) -> None:
        super().__init__()
        self.on_wake: WakeHandler = self.prompt_wake
        self.wake_requests = 0

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append({"headers": dict(request.headers), "body": body, "peer": None})
        messages = body["messages"]
        last = messages[-1]
        if any(SUBAGENT_MARKER in _content(m) for m in messages if m["role"] == "system"):
            return await self.reply(request, body, RESULT)
        if last["role"] == "tool":
            return await self.reply(request, body, "Started it in the background.")
        if last["role"] == "user" and _content(last).startswith(WAKE_MARKER):
            self.wake_requests += 1
            return await self.on_wake(request, body)
        if last["role"] == "user" and "ASK-BG" in _content(last):
            call = {
                "id": "call_1",
                "type": "function",
                "function": {
                    "name": "delegate_task",
                    "arguments": json.dumps({"goal": "count the stars", "background": True}),
                },
            }
            return await self.reply(request, body, None, tool_calls=[call])
        return await self.reply(request, body, "It found forty-two.")

    async def reply(
        self,
        request: web.Request,
        body: dict[str, Any],
        content: str | None,
        *,
        tool_calls: list[dict[str, Any]] | None = None,
    ) -> web.StreamResponse:
        """A whole answer at once: JSON, or SSE when the request streams."""
        finish = "tool_calls" if tool_calls else "stop"
        if not body.get("stream"):
            return web.json_response(_completion_body(content, tool_calls, finish))
        chunks = [_chunk({"role": "assistant", "content": ""})]
        if content:
            chunks.append(_chunk({"content": content}))
        if tool_calls:
            chunks.append(_chunk({"tool_calls": [{"index": 0, **tool_calls[0]}]}))
        chunks.append(_chunk({}, finish_reason=finish))
        response = await self.open_stream(request)
        for chunk in chunks:
            await self.send(response, chunk)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def prompt_wake(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        return await self.reply(request, body, PROMPT_REPLY)

    @staticmethod
    async def open_stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        return response

    @staticmethod
    async def send(response: web.StreamResponse, payload: dict[str, Any]) -> None:
        await response.write(f"data: {json.dumps(payload)}\n\n".encode())


async def start_server(home: Path, upstream: Upstream, **kw: Any) -> tuple[Server, WebClient]:
    port = free_port()
    env = {
        "REVEILLE_PROVIDER": "openai",
        "REVEILLE_MODEL": "fake-model",
        "OPENAI_BASE_URL": upstream.base_url,
        "OPENAI_API_KEY": "sk-fake",
        "REVEILLE_WEBUI_PORT": str(port),
    }
    # Off the event loop: the fake model answers on it while the server starts (a restarted
    # server re-offers its pending wake-up at once).
    server = await asyncio.to_thread(Server, home, extra_env=env, **kw)
    server.wait_for(re.compile(rf"web UI: http://127\.0\.0\.1:{port}/"))
    return server, await WebClient.open(port)


async def until(check: Callable[[], Awaitable[Any]], timeout: float = 20.0) -> Any:
    """Poll ``check`` (a coroutine function) until it answers something true."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if value := await check():
            return value
        await asyncio.sleep(0.05)
    raise AssertionError("condition not met in time")


def wake_stream_deltas(sse: Sse) -> str | None:
    """The text the wake-up turn has streamed so far, or None before it started."""
    starts = [s["stream_id"] for s in sse.of("turn.start") if s["wakeup"]]
    if not starts:
        return None
    return "".join(d["text"] for d in sse.of("turn.delta") if d["stream_id"] == starts[0])


KILL_POINTS = ["request", "mid_stream", "last_chunk", "stored"]


@pytest.mark.parametrize("kill_point", KILL_POINTS)
async def test_a_wakeup_turn_killed_mid_way_is_delivered_once_after_a_restart(
    tmp_path: Path, kill_point: str
) -> None:
    """Kill points: (request) the wake-up's model request has just arrived; (mid_stream)
    the browser has been shown part of the slow reply; (last_chunk) the whole reply and its
    finish chunk were sent and shown, but not the stream's end, so the turn is not stored;
    (stored) the turn is stored but its ledger row not yet acknowledged."""
    home = tmp_path / "home"
    upstream = Upstream()
    await upstream.start()
    killed = asyncio.Event()  # the server is dead: a held stream may end
    servers: list[Server] = []

    async def slow_wake(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        if kill_point == "request":
            servers[0].proc.send_signal(signal.SIGKILL)
            killed.set()
            return web.Response(status=500)
        response = await upstream.open_stream(request)
        with contextlib.suppress(ConnectionError):
            await upstream.send(response, _chunk({"role": "assistant", "content": ""}))
            for piece in SLOW_REPLY:
                if killed.is_set():
                    return response
                await upstream.send(response, _chunk({"content": piece}))
                await asyncio.sleep(STEP_SECONDS)
            await upstream.send(response, _chunk({}, finish_reason="stop"))
            if kill_point == "last_chunk":
                await killed.wait()  # no [DONE]: the client waits for the stream's end
                return response
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        return response

    upstream.on_wake = slow_wake
    web_ui: WebClient | None = None
    sse: Sse | None = None
    try:
        # --- the first server: the user asks, the wake-up turn starts, SIGKILL ---------
        first, web_ui = await start_server(home, upstream, hold_ack=kill_point == "stored")
        servers.append(first)
        sse = await web_ui.stream()
        sid = await web_ui.new_session("stars")
        await web_ui.say(sid, "ASK-BG count the stars, in the background")

        if kill_point == "mid_stream":
            await sse.wait_for(lambda e: bool(wake_stream_deltas(sse)), timeout=20)
        elif kill_point == "last_chunk":
            whole = "".join(SLOW_REPLY)
            await sse.wait_for(lambda e: wake_stream_deltas(sse) == whole, timeout=20)
        elif kill_point == "stored":
            await asyncio.to_thread(first.wait_for, re.compile(r"HOLDING-ACK deleg_\w+"))
        if kill_point != "request":
            first.proc.send_signal(signal.SIGKILL)
            killed.set()
        else:
            await asyncio.wait_for(killed.wait(), 20)
        assert await asyncio.to_thread(first.proc.wait, 30) == -signal.SIGKILL
        if kill_point == "mid_stream":
            assert wake_stream_deltas(sse) != "".join(SLOW_REPLY)  # killed mid-way indeed
        killed_streams = [s["stream_id"] for s in sse.of("turn.start") if s["wakeup"]]
        last_seen = sse.events[-1][0]
        await sse.close()
        await web_ui.close()
        assert upstream.wake_requests == 1

        (row,) = [r for r in await asyncio.to_thread(ledger_rows, home) if r.kind == "delegation"]
        assert row.event and RESULT in str(row.event.get("summary"))
        assert row.delivery_state == "pending"  # never acknowledged: the server died first

        # --- the restart: the row is re-offered, the model answers promptly -------------
        upstream.on_wake = upstream.prompt_wake
        second, web_ui = await start_server(home, upstream)
        servers.append(second)
        await asyncio.to_thread(second.wait_for, re.compile("re-offering 1 undelivered"))
        if kill_point != "stored" and killed_streams:
            # A tab open through the crash reconnects: the killed turn's stream ends (it
            # would otherwise show its partial reply as running for good).
            resumed = await web_ui.stream(last_seen)
            _, _, end = await resumed.wait_for(
                lambda e: e[1] == "turn.end" and e[2]["stream_id"] == killed_streams[0]
            )
            assert end["status"] == "error" and "interrupted" in end["error"]
            await resumed.close()

        def delivered() -> bool:
            rows = [r for r in ledger_rows(home) if r.id == row.id]
            return bool(rows) and rows[0].delivery_state == "delivered"

        await asyncio.to_thread(wait_until, delivered)
        items = (await web_ui.session(sid))["items"]
        cards = [i for i in items if i["kind"] == "wakeup"]
        replies = [i for i in items if i["kind"] == "message" and i["wakeup"]]
        assert len(cards) == 1, items
        assert cards[0]["card"]["delivery_id"] == row.id
        assert len(replies) == 1, items
        # The reply is a whole one: the restarted server's, or (stored before the kill) the
        # first server's; never the part shown before the kill.
        expected = "".join(SLOW_REPLY) if kill_point == "stored" else PROMPT_REPLY
        assert replies[0]["content"] == expected
        assert items.index(replies[0]) == items.index(cards[0]) + 1
        assert not any(i.get("stopped") for i in items)
        messages = [(i["role"], i["wakeup"]) for i in items if i["kind"] == "message"]
        assert messages == [("user", False), ("assistant", False), ("assistant", True)]
        # A stored wake-up turn is not run again; one that was not runs once more.
        assert upstream.wake_requests == (1 if kill_point == "stored" else 2)

        # --- the next turn: its model context holds the result, once ---------------------
        await web_ui.say(sid, "ASK-FOLLOWUP what did it find?")

        async def answered() -> bool:
            items = (await web_ui.session(sid))["items"]
            return items[-1]["kind"] == "message" and items[-1]["content"] == "It found forty-two."

        await until(answered)
        (followup,) = [
            r["body"]["messages"]
            for r in upstream.requests
            if "ASK-FOLLOWUP" in _content(r["body"]["messages"][-1])
        ]
        holding = [m for m in followup if RESULT in _content(m)]
        assert len(holding) == 1, followup
        assert holding[0]["role"] == "user" and _content(holding[0]).startswith(WAKE_MARKER)
        assert upstream.wake_requests == (1 if kill_point == "stored" else 2)
        assert await asyncio.to_thread(second.stop) == 0, "".join(second.lines)
    finally:
        killed.set()
        if sse is not None:
            await sse.close()
        if web_ui is not None:
            await web_ui.close()
        for server in servers:
            if server.proc.poll() is None:
                server.proc.kill()
                await asyncio.to_thread(server.proc.wait, 30)
        await upstream.stop()
