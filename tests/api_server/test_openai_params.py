"""Issue 21 item 5: every OpenAI parameter the server takes reaches the model provider, and
every one it cannot honour is a 400 naming it; nothing is silently dropped.

The real API server runs in front of the OpenAI-compatible provider, which talks to
``FakeOpenAI`` (a real HTTP server on loopback that records each request): the assertions
are on what the upstream received.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest

from agent.loop import Agent
from agent.providers import OpenAICompatProvider
from agent.tools import Tool, ToolRegistry
from gateway.surfaces.api_server.adapter import ApiServerAdapter
from tests.agent.test_openai_compat import FakeOpenAI, _chunk, completion, sse

from ._support import KEY, client_for, running_adapter

MODEL = "fake-model"
SCHEMA = {
    "type": "json_schema",
    "json_schema": {
        "name": "answer",
        "schema": {"type": "object", "properties": {"a": {"type": "string"}}},
        "strict": True,
    },
}


async def _lookup(args: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return {"answer": "sunny"}


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    server = FakeOpenAI()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def adapter(store, fake) -> AsyncIterator[ApiServerAdapter]:
    provider = OpenAICompatProvider(fake.base_url, "sk-up", MODEL, 10.0, max_retries=0)
    registry = ToolRegistry([Tool("lookup", "look up", {"type": "object"}, _lookup)])
    server = ApiServerAdapter(
        store=store,
        agent=Agent(provider, registry),
        port=0,
        api_key=KEY,
        model_name=MODEL,
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop()
        await provider.aclose()


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


async def test_every_sampling_parameter_reaches_the_upstream(adapter, fake) -> None:
    client = client_for(adapter.port)
    reply = await client.chat.completions.create(
        model=MODEL,
        messages=user("weather?"),
        temperature=0.3,
        top_p=0.9,
        max_tokens=55,
        stop=["END", "STOP"],
        seed=42,
        response_format=SCHEMA,
        tool_choice="auto",
        parallel_tool_calls=False,
        n=1,
    )
    assert reply.choices[0].message.content == "default reply"
    body = fake.requests[0]["body"]
    assert body["model"] == MODEL
    assert body["temperature"] == 0.3
    assert body["top_p"] == 0.9
    assert body["max_tokens"] == 55
    assert "max_completion_tokens" not in body
    assert body["stop"] == ["END", "STOP"]
    assert body["seed"] == 42
    assert body["response_format"] == SCHEMA
    assert body["tool_choice"] == "auto"
    assert body["parallel_tool_calls"] is False
    assert [t["function"]["name"] for t in body["tools"]] == ["lookup"]
    assert "n" not in body


async def test_max_completion_tokens_and_a_single_stop_pass_as_sent(adapter, fake) -> None:
    client = client_for(adapter.port)
    await client.chat.completions.create(
        model=MODEL,
        messages=user("hi"),
        max_completion_tokens=7,
        stop="\n\n",
        response_format={"type": "json_object"},
    )
    body = fake.requests[0]["body"]
    assert body["max_completion_tokens"] == 7 and "max_tokens" not in body
    assert body["stop"] == "\n\n"
    assert body["response_format"] == {"type": "json_object"}


async def test_a_request_without_parameters_sends_none_upstream(adapter, fake) -> None:
    await client_for(adapter.port).chat.completions.create(model=MODEL, messages=user("hi"))
    assert set(fake.requests[0]["body"]) == {"model", "messages", "tools"}


async def test_streaming_with_include_usage_carries_the_options_and_a_usage_chunk(
    adapter, fake
) -> None:
    fake.script = [
        sse(
            _chunk({"content": "Hel"}),
            _chunk({"content": "lo"}),
            _chunk({}, "stop"),
            _chunk(
                {},
                usage={"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
                choices=False,
            ),
        )
    ]
    stream = await client_for(adapter.port).chat.completions.create(
        model=MODEL,
        messages=user("hi"),
        stream=True,
        stream_options={"include_usage": True},
        temperature=1.5,
        seed=7,
    )
    text, usage = [], None
    async for chunk in stream:
        if chunk.choices:
            text.append(chunk.choices[0].delta.content or "")
        elif chunk.usage is not None:
            usage = chunk.usage
    assert "".join(text) == "Hello"
    assert usage is not None and usage.total_tokens == 5
    body = fake.requests[0]["body"]
    assert body["stream"] is True and body["temperature"] == 1.5 and body["seed"] == 7


async def test_tool_choice_required_holds_for_the_first_model_call_only(adapter, fake) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    fake.script = [completion(None, [call], "tool_calls"), completion("It is sunny.")]
    reply = await client_for(adapter.port).chat.completions.create(
        model=MODEL,
        messages=user("weather?"),
        tool_choice="required",
    )
    assert reply.choices[0].message.content == "It is sunny."
    assert [r["body"]["tool_choice"] for r in fake.requests] == ["required", "auto"]


async def test_image_parts_reach_the_upstream_and_the_transcript_keeps_the_text(
    adapter, fake
) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, image]}]
    raw = await client_for(adapter.port).chat.completions.with_raw_response.create(
        model=MODEL,
        messages=messages,
    )
    sent = fake.requests[0]["body"]["messages"][-1]
    assert sent == {"role": "user", "content": [{"type": "text", "text": "what is this?"}, image]}
    session_id = raw.headers["X-Hermes-Session-Id"]
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"http://127.0.0.1:{adapter.port}/api/sessions/{session_id}/messages",
            headers={"Authorization": f"Bearer {KEY}"},
        ) as response,
    ):
        rows = (await response.json())["data"]
    assert rows[0]["content"] == "what is this?"


async def _post(port: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {KEY}"},
        ) as response,
    ):
        return response.status, await response.json()


_TOOL = {"type": "function", "function": {"name": "mine", "parameters": {"type": "object"}}}
_INVALID = [
    ("temperature", 2.5, "temperature"),
    ("temperature", -0.1, "temperature"),
    ("temperature", "hot", "temperature"),
    ("top_p", 1.5, "top_p"),
    ("max_tokens", 0, "max_tokens"),
    ("max_tokens", 1.5, "max_tokens"),
    ("max_completion_tokens", -1, "max_completion_tokens"),
    ("stop", ["a", "b", "c", "d", "e"], "stop"),
    ("stop", 3, "stop"),
    ("seed", 1.5, "seed"),
    ("seed", True, "seed"),
    ("response_format", {"type": "xml"}, "response_format"),
    ("response_format", {"type": "json_schema"}, "response_format"),
    ("response_format", "json", "response_format"),
    ("tool_choice", {"type": "function", "function": {"name": "nothing"}}, "tool_choice"),
    ("tool_choice", "sometimes", "tool_choice"),
    ("parallel_tool_calls", "yes", "parallel_tool_calls"),
    ("n", 2, "n"),
    ("tools", [{"type": "web_search"}], "tools"),
    ("functions", [{"name": "mine"}], "functions"),
    ("stream_options", {"include_usage": "yes"}, "stream_options"),
]


@pytest.mark.parametrize(("field", "value", "param"), _INVALID)
async def test_a_bad_or_unsupported_value_is_a_400_naming_it(
    adapter, fake, field: str, value: Any, param: str
) -> None:
    status, body = await _post(adapter.port, {"model": MODEL, "messages": user("hi"), field: value})
    assert status == 400, body
    assert body["error"]["param"] == param
    assert body["error"]["type"] == "invalid_request_error"
    assert fake.requests == []


async def test_n_above_one_says_only_one_is_supported(adapter, fake) -> None:
    with pytest.raises(openai.BadRequestError, match="only n=1 is supported"):
        await client_for(adapter.port).chat.completions.create(
            model=MODEL,
            messages=user("hi"),
            n=3,
        )


async def test_tools_other_than_functions_are_refused_with_a_clear_400(adapter, fake) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await client_for(adapter.port).chat.completions.create(
            model=MODEL,
            messages=user("hi"),
            tools=[{"type": "mcp", "server_url": "http://127.0.0.1:9/"}],  # type: ignore[list-item]
        )
    assert caught.value.body["param"] == "tools"
    assert "never calls a URL" in caught.value.message
    assert fake.requests == []


async def test_an_image_part_without_a_url_is_a_400(adapter, fake) -> None:
    content = [{"type": "image_url", "image_url": {}}]
    status, body = await _post(
        adapter.port, {"model": MODEL, "messages": [{"role": "user", "content": content}]}
    )
    assert status == 400 and body["error"]["param"] == "messages[0].content"


async def test_a_model_the_server_does_not_serve_is_a_404(adapter, fake) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        await client_for(adapter.port).chat.completions.create(
            model="gpt-4o",
            messages=user("hi"),
        )
    assert caught.value.body["code"] == "model_not_found"
    assert caught.value.body["param"] == "model"
    assert fake.requests == []


async def test_the_demo_model_accepts_options_and_says_it_cannot_see_images(store) -> None:
    async with running_adapter(store) as (server, provider, _runner):
        client = client_for(server.port)
        image = {"type": "image_url", "image_url": {"url": "https://example.invalid/a.png"}}
        reply = await client.chat.completions.create(
            model="reveille-demo",
            messages=[{"role": "user", "content": [{"type": "text", "text": "look"}, image]}],
            temperature=0.2,
            seed=1,
            max_tokens=10,
        )
        assert "cannot see images" in (reply.choices[0].message.content or "")
        assert provider.contexts[-1][-1]["content"][-1] == image


def test_a_body_without_parameters_skips_their_checks_and_no_parameter_is_missed() -> None:
    """A body that sets no generation parameter gets the unset options without a check
    per parameter: the parameters looked for are every option's and ``n``, so a body that
    sets any one of them is checked (a parameter added to ``ModelOptions`` is looked for)."""
    from dataclasses import fields

    from agent.providers.base import ModelOptions
    from gateway.http.middleware import ApiError
    from gateway.openai import chat_params

    names = {item.name for item in fields(ModelOptions)}
    assert names | {"n"} == chat_params._PARAMS
    unset = chat_params.model_options({"model": MODEL, "messages": []})
    assert unset == ModelOptions() and not unset
    assert chat_params.model_options({"seed": 7}) == ModelOptions(seed=7)
    assert chat_params.model_options({"seed": 7})
    with pytest.raises(ApiError):
        chat_params.model_options({"n": 2})


def test_options_are_false_only_when_none_is_set_whichever_instance() -> None:
    """``bool(ModelOptions)`` answers the unset instance without a comparison, and any
    other instance by comparing: an unset one made elsewhere is false too."""
    from agent.providers.base import UNSET_OPTIONS, ModelOptions

    assert not UNSET_OPTIONS and not ModelOptions() and ModelOptions() is not UNSET_OPTIONS
    assert ModelOptions(seed=0) and ModelOptions(tool_choice="none")


def test_a_body_without_tools_gets_the_offer_of_an_empty_tools_list() -> None:
    """The request without ``tools``, ``tool_choice`` or ``functions`` (most) skips their
    checks and gets what an empty ``tools`` list gets, server tools on or off."""
    from gateway.openai.client_tools import read_tool_request

    for server_tools in (True, False):
        bare = read_tool_request({"model": MODEL}, ("terminal",), server_tools=server_tools)
        empty = read_tool_request(
            {"model": MODEL, "tools": [], "tool_choice": None},
            ("terminal",),
            server_tools=server_tools,
        )
        assert bare == empty and bare.offer.server_tools is server_tools
        assert bare.offer.client == () and bare.offer.allowed is None and bare.tool_choice is None
