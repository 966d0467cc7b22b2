"""The OpenAI-compatible provider against a fake OpenAI-compatible server on loopback.

Only the model endpoint is faked, as a real HTTP server speaking the chat-completions
protocol (JSON and SSE), so the official client, streaming assembly and error translation
all run for real.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import warnings

import pytest
from aiohttp import web

from agent.loop import Agent
from agent.providers import OpenAICompatProvider, ProviderError, build_provider
from agent.subagent import run_subagent_sync
from agent.tools import Tool, ToolContext, ToolRegistry

API_KEY = "sk-test-SECRET-0123456789"


class FakeOpenAI:
    """Replies to /v1/chat/completions from a script of handlers, recording each request."""

    def __init__(self):
        self.requests: list[dict] = []
        self.script: list = []
        self.default = None  # the handler once the script is used up (else "default reply")
        self.base_url = ""
        self._runner: web.AppRunner | None = None
        self.stopping = asyncio.Event()

    async def start(self):
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.base_url = f"http://127.0.0.1:{port}/v1"

    async def stop(self):
        self.stopping.set()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request):
        body = await request.json()
        peer = request.transport.get_extra_info("peername") if request.transport else None
        self.requests.append({"headers": dict(request.headers), "body": body, "peer": peer})
        handler = self.script.pop(0) if self.script else self.default or completion("default reply")
        return await handler(request, body)


def _completion_body(content, tool_calls=None, finish_reason="stop"):
    message = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "fake-model",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
    }


def completion(content, tool_calls=None, finish_reason="stop"):
    async def handler(request, body):
        return web.json_response(_completion_body(content, tool_calls, finish_reason))

    return handler


def _chunk(delta, finish_reason=None, usage=None, choices=True):
    payload = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    payload["choices"] = (
        [{"index": 0, "delta": delta, "finish_reason": finish_reason}] if choices else []
    )
    if usage is not None:
        payload["usage"] = usage
    return payload


def sse(*payloads, done=True, pause=0.0):
    async def handler(request, body):
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for payload in payloads:
            data = payload if isinstance(payload, str) else json.dumps(payload)
            await response.write(f"data: {data}\n\n".encode())
            if pause:
                await asyncio.sleep(pause)
        if done:
            await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    return handler


def error(status, message):
    async def handler(request, body):
        return web.json_response(
            {"error": {"message": message, "type": "invalid_request_error", "code": None}},
            status=status,
        )

    return handler


def slow(server, seconds):
    async def handler(request, body):
        # Ends early when the server stops, so teardown does not wait out the sleep.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(server.stopping.wait(), seconds)
        return web.json_response(_completion_body("too late"))

    return handler


@pytest.fixture
async def fake():
    server = FakeOpenAI()
    await server.start()
    yield server
    await server.stop()


def provider_for(fake, **kwargs):
    options = {"max_retries": 0, **kwargs}
    return OpenAICompatProvider(fake.base_url, API_KEY, "fake-model", 10.0, **options)


async def test_non_streaming_completion(fake):
    fake.script = [completion("Hello from the fake.")]
    provider = provider_for(fake)
    reply = await provider.complete([{"role": "user", "content": "hi"}])
    assert reply.content == "Hello from the fake."
    assert reply.tool_calls == []
    assert reply.finish_reason == "stop"
    assert reply.usage == {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
    request = fake.requests[0]
    assert request["headers"]["Authorization"] == f"Bearer {API_KEY}"
    assert request["body"]["model"] == "fake-model"
    assert request["body"]["messages"] == [{"role": "user", "content": "hi"}]
    assert "tools" not in request["body"]
    assert "stream" not in request["body"] or request["body"]["stream"] is False
    assert provider.name == "fake-model"


async def test_non_streaming_tool_calls_are_returned_in_openai_shape(fake):
    calls = [
        {
            "id": "call_abc",
            "type": "function",
            "function": {"name": "terminal", "arguments": '{"command": "ls"}'},
        }
    ]
    fake.script = [completion(None, calls, "tool_calls")]
    tools = [{"type": "function", "function": {"name": "terminal", "parameters": {}}}]
    reply = await provider_for(fake).complete([{"role": "user", "content": "ls"}], tools=tools)
    assert reply.content is None
    assert reply.tool_calls == calls
    assert reply.finish_reason == "tool_calls"
    assert fake.requests[0]["body"]["tools"] == tools


async def test_streaming_assembles_content_and_fragmented_tool_calls(fake):
    fake.script = [
        sse(
            _chunk({"role": "assistant", "content": ""}),
            _chunk({"content": "Let me "}),
            _chunk({"content": "check."}),
            _chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "delegate_task", "arguments": ""},
                        }
                    ]
                }
            ),
            _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"goal": "wr'}}]}),
            _chunk(
                {
                    "tool_calls": [
                        {
                            "index": 1,
                            "id": "call_2",
                            "type": "function",
                            "function": {"name": "terminal", "arguments": '{"comm'},
                        }
                    ]
                }
            ),
            _chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'ite", "b'}}]}),
            _chunk({"tool_calls": [{"index": 1, "function": {"arguments": 'and": "ls"}'}}]}),
            _chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'ackground": true}'}}]}),
            _chunk({}, finish_reason="tool_calls"),
            _chunk(
                None,
                usage={"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14},
                choices=False,
            ),
        )
    ]
    pieces = []

    async def on_delta(piece):
        pieces.append(piece)

    reply = await provider_for(fake).complete(
        [{"role": "user", "content": "go"}], tools=[], on_delta=on_delta
    )
    assert pieces == ["Let me ", "check."]
    assert reply.content == "Let me check."
    assert reply.finish_reason == "tool_calls"
    assert reply.usage == {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}
    assert reply.tool_calls == [
        {
            "id": "call_1",
            "type": "function",
            "function": {
                "name": "delegate_task",
                "arguments": '{"goal": "write", "background": true}',
            },
        },
        {
            "id": "call_2",
            "type": "function",
            "function": {"name": "terminal", "arguments": '{"command": "ls"}'},
        },
    ]
    body = fake.requests[0]["body"]
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}


async def test_streaming_content_arrives_piece_by_piece(fake):
    fake.script = [
        sse(
            *[_chunk({"content": word}) for word in ["One ", "two ", "three."]],
            _chunk({}, finish_reason="stop"),
            pause=0.05,
        )
    ]
    arrivals = []
    loop = asyncio.get_running_loop()

    async def on_delta(piece):
        arrivals.append((piece, loop.time()))

    reply = await provider_for(fake).complete(
        [{"role": "user", "content": "count"}], on_delta=on_delta
    )
    assert reply.content == "One two three."
    assert [p for p, _ in arrivals] == ["One ", "two ", "three."]
    # Each piece was handed over as it arrived, not all at the end.
    assert arrivals[-1][1] - arrivals[0][1] >= 0.08
    assert reply.usage["total_tokens"] == 0  # this server sent no usage


async def test_stream_usage_can_be_turned_off(fake):
    fake.script = [sse(_chunk({"content": "x"}), _chunk({}, finish_reason="stop"))]

    async def on_delta(piece):
        pass

    await provider_for(fake, stream_usage=False).complete([], on_delta=on_delta)
    assert "stream_options" not in fake.requests[0]["body"]


@pytest.mark.parametrize("stream", [False, True])
async def test_401_becomes_a_provider_error_without_the_key(fake, stream):
    fake.script = [error(401, f"Incorrect API key provided: {API_KEY}.")]

    async def on_delta(piece):
        pass

    with pytest.raises(ProviderError) as caught:
        await provider_for(fake).complete([], on_delta=on_delta if stream else None)
    message = str(caught.value)
    assert caught.value.status_code == 401
    assert "HTTP 401" in message
    assert "Incorrect API key provided" in message
    assert "fake-model" in message
    assert API_KEY not in message
    assert "SECRET" not in message
    assert caught.value.__cause__ is None
    assert caught.value.__suppress_context__


async def test_500_becomes_a_provider_error(fake):
    fake.script = [error(500, "upstream exploded")]
    with pytest.raises(ProviderError, match=r"HTTP 500: upstream exploded") as caught:
        await provider_for(fake).complete([{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 500
    assert len(fake.requests) == 1  # max_retries=0: exactly one attempt


async def test_error_inside_a_stream_becomes_a_provider_error(fake):
    fake.script = [sse(_chunk({"content": "par"}), {"error": {"message": "model overloaded"}})]

    async def on_delta(piece):
        pass

    with pytest.raises(ProviderError, match="model overloaded"):
        await provider_for(fake).complete([], on_delta=on_delta)


async def test_timeout_becomes_a_provider_error(fake):
    fake.script = [slow(fake, 5.0)]
    provider = OpenAICompatProvider(fake.base_url, API_KEY, "fake-model", 0.3, max_retries=0)
    with pytest.raises(ProviderError, match=r"timed out after 0.3 s"):
        await provider.complete([])


async def test_unreachable_endpoint_becomes_a_provider_error():
    # A port that was just free: nothing listens there.
    server = FakeOpenAI()
    await server.start()
    base_url = server.base_url
    await server.stop()
    provider = OpenAICompatProvider(
        f"http://user:pw@{base_url.removeprefix('http://')}", API_KEY, "m", 2.0, max_retries=0
    )
    with pytest.raises(ProviderError, match="could not be reached") as caught:
        await provider.complete([])
    assert "pw" not in str(caught.value)
    assert API_KEY not in repr(provider)


async def test_a_refused_connection_is_not_reported_as_a_timeout():
    # Through the SDK's aiohttp transport (no credentials in the url), a refused connection
    # surfaces as APITimeoutError; the message must still say it could not be reached.
    server = FakeOpenAI()
    await server.start()
    base_url = server.base_url
    await server.stop()
    provider = OpenAICompatProvider(base_url, API_KEY, "m", 120.0, max_retries=0)
    with pytest.raises(ProviderError, match="could not be reached") as caught:
        await provider.complete([])
    assert "timed out" not in str(caught.value)


async def test_a_failing_consumer_is_not_reported_as_a_provider_failure(fake):
    fake.script = [sse(_chunk({"content": "a"}), _chunk({"content": "b"}))]

    class ClientGone(Exception):
        pass

    async def on_delta(piece):
        raise ClientGone()

    with pytest.raises(ClientGone):
        await provider_for(fake).complete([], on_delta=on_delta)


async def test_without_a_key_local_servers_still_work(fake):
    fake.script = [completion("local")]
    provider = OpenAICompatProvider(fake.base_url, None, "llama", 5.0, max_retries=0)
    assert (await provider.complete([])).content == "local"
    assert fake.requests[0]["headers"]["Authorization"].startswith("Bearer ")


async def test_agent_loop_runs_a_tool_round_trip_over_http(fake):
    tool_call = {
        "index": 0,
        "id": "call_x",
        "type": "function",
        "function": {"name": "lookup", "arguments": '{"q": "weather"}'},
    }
    fake.script = [
        sse(_chunk({"tool_calls": [tool_call]}), _chunk({}, "tool_calls")),
        sse(_chunk({"content": "Sunny, "}), _chunk({"content": "20 C."}), _chunk({}, "stop")),
    ]

    async def lookup(args, ctx):
        return {"answer": f"{args['q']}: sunny"}

    registry = ToolRegistry([Tool("lookup", "look up", {"type": "object"}, lookup)])
    pieces = []

    async def on_delta(piece):
        pieces.append(piece)

    provider = provider_for(fake)
    result = await Agent(provider, registry).run(
        [{"role": "user", "content": "weather?"}], ToolContext(), on_delta=on_delta
    )
    assert result.content == "Sunny, 20 C."
    assert "".join(pieces) == "Sunny, 20 C."
    second = fake.requests[1]["body"]["messages"]
    assert second[-1] == {
        "role": "tool",
        "tool_call_id": "call_x",
        "content": '{"answer": "weather: sunny"}',
    }
    assert second[-2]["tool_calls"][0]["function"]["name"] == "lookup"


async def test_one_provider_serves_the_main_loop_and_worker_thread_loops(fake):
    # Sub-agents run under asyncio.run on worker threads; the same provider object must
    # work there and keep working on the main loop afterwards.
    fake.script = [
        completion("main 1"),
        completion("sub a"),
        completion("sub b"),
        completion("main 2"),
    ]
    provider = provider_for(fake)
    assert (await provider.complete([])).content == "main 1"
    first = await asyncio.to_thread(run_subagent_sync, provider, "goal a", None)
    second = await asyncio.to_thread(run_subagent_sync, provider, "goal b", "ctx")
    assert first == {"status": "completed", "summary": "sub a"}
    assert second == {"status": "completed", "summary": "sub b"}
    assert (await provider.complete([])).content == "main 2"
    sub_request = fake.requests[1]["body"]["messages"]
    assert "[reveille:subagent]" in sub_request[0]["content"]
    assert sub_request[1]["content"] == "Goal: goal a"
    assert "tools" not in fake.requests[1]["body"]
    await provider.aclose()


async def test_subagent_failure_on_a_worker_thread_is_reported(fake):
    fake.script = [error(500, "nope")]
    provider = provider_for(fake)
    outcome = await asyncio.to_thread(run_subagent_sync, provider, "g", None)
    assert outcome["status"] == "failed"
    assert "HTTP 500: nope" in outcome["error"]


def raw(status, text, content_type="application/json"):
    async def handler(request, body):
        return web.Response(status=status, text=text, content_type=content_type)

    return handler


async def test_one_client_serves_every_turn_and_aclose_closes_it(fake):
    # One long-lived client per loop: turns reuse its keep-alive connection instead of
    # building a client (and a connection) per call; aclose releases it.
    fake.script = [completion("one"), sse(_chunk({"content": "two"})), completion("three")]
    provider = provider_for(fake)
    pieces: list[str] = []

    async def on_delta(piece):
        pieces.append(piece)

    assert (await provider.complete([{"role": "user", "content": "a"}])).content == "one"
    streamed = await provider.complete([{"role": "user", "content": "b"}], on_delta=on_delta)
    assert streamed.content == "two" and pieces == ["two"]
    assert (await provider.complete([{"role": "user", "content": "c"}])).content == "three"
    peers = {request["peer"] for request in fake.requests}
    assert len(peers) == 1, peers
    (client,) = provider._clients.values()
    assert not client.is_closed()

    await provider.aclose()
    assert client.is_closed()
    assert provider._clients == {}
    # A provider stays usable after aclose: the next call opens a fresh client.
    fake.script = [completion("four")]
    assert (await provider.complete([])).content == "four"
    assert fake.requests[-1]["peer"] not in peers
    await provider.aclose()


async def test_requests_carry_the_key_and_the_wire_format_untouched(fake):
    fake.script = [completion("ok"), sse(_chunk({"content": "ok"}))]
    provider = provider_for(fake)
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "Looks a thing up.",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            },
        }
    ]
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [_call("c1", "lookup", "{}")]},
        {"role": "tool", "tool_call_id": "c1", "content": "found"},
    ]

    async def ignore(piece):
        pass

    with warnings.catch_warnings():
        # The SDK deprecates a body passed as bytes (``content=`` is the way that lasts).
        warnings.simplefilter("error", DeprecationWarning)
        await provider.complete(messages, tools=tools)
        await provider.complete(messages, tools=tools, on_delta=ignore)
    plain, streamed = (request["body"] for request in fake.requests)
    assert plain == {"model": "fake-model", "messages": messages, "tools": tools}
    assert streamed == {
        "model": "fake-model",
        "messages": messages,
        "tools": tools,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    for request in fake.requests:
        assert request["headers"]["Authorization"] == f"Bearer {API_KEY}"
        assert request["headers"]["Content-Type"] == "application/json"
    await provider.aclose()


def _call(call_id, name, arguments):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


@pytest.mark.parametrize(
    ("text", "content_type", "match"),
    [
        ('{"id": "x", "object": "chat.completion"}', "application/json", "no choices"),
        ('{"choices": [{"index": 0}]}', "application/json", "without a message"),
        ("<html>not an API</html>", "text/html", "no choices"),
        ("[1, 2]", "application/json", "no choices"),
    ],
)
async def test_a_reply_not_shaped_like_a_completion_is_a_provider_error(
    fake, text, content_type, match
):
    fake.script = [raw(200, text, content_type)]
    provider = provider_for(fake)
    with pytest.raises(ProviderError, match=match):
        await provider.complete([])
    await provider.aclose()


async def test_stream_chunks_not_shaped_like_chunks_are_a_provider_error(fake):
    fake.script = [sse("[1, 2]")]
    provider = provider_for(fake)

    async def ignore(piece):
        pass

    with pytest.raises(ProviderError, match="malformed stream data"):
        await provider.complete([], on_delta=ignore)
    await provider.aclose()


def test_build_provider_kinds():
    assert build_provider(kind="demo", demo_delay=0.5).delay_seconds == 0.5
    provider = build_provider(kind="OpenAI", base_url="http://x/v1", api_key="k", model="m")
    assert isinstance(provider, OpenAICompatProvider)
    assert provider.name == "m"
    with pytest.raises(ValueError, match="model name"):
        build_provider(kind="openai")
    with pytest.raises(ValueError, match="unknown provider kind"):
        build_provider(kind="llama")


async def test_per_request_transport_logs_are_quieted_unless_debugging(fake):
    import logging

    transport = logging.getLogger("httpx2")
    root = logging.getLogger()
    saved = (transport.level, root.level)
    try:
        transport.setLevel(logging.NOTSET)
        root.setLevel(logging.INFO)
        provider = provider_for(fake)
        await provider.complete([])
        assert transport.level == logging.WARNING
        await provider.aclose()

        transport.setLevel(logging.NOTSET)
        root.setLevel(logging.DEBUG)
        provider = provider_for(fake)
        await provider.complete([])
        assert transport.level == logging.NOTSET
        await provider.aclose()
    finally:
        transport.setLevel(saved[0])
        root.setLevel(saved[1])
