"""Our own Open Responses compliance checks, against a real `reveille serve`.

The upstream compliance suite (openresponses/openresponses, run with bun) is on no registry
this CI can reach and its code is not ours to vendor, so these tests check the same
scenarios with the official ``openai`` client: a basic response, a stream (every event
validated), a system prompt, a client function tool (a ``function_call`` item, then its
output continuing the chain), the same streamed (``output_item.added`` with the call,
``function_call_arguments.delta``/``.done``, ``output_item.done``), an image input as a
data URL, a multi-turn input, the same over WebSocket mode, and compact. The server's model
is a fake OpenAI-compatible one on loopback that calls the client tool when asked about the
weather (``tests/ecosystem/fake_model.py``). Every Response object and stream event is
validated against the ``openai`` types (``Conformance`` of ``test_openai_types``): each
test asserts 0 rejects, and the module prints how many objects it checked.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import aiohttp
import openai
import pytest
from openai.types.responses import CompactedResponse, Response
from openai.types.responses.responses_server_event import ResponseWsError

from tests.api_server.serve_support import KEY, Server
from tests.api_server.test_openai_types import Conformance
from tests.ecosystem.fake_model import CLIENT_TOOL, MODEL, SUMMARY, ThreadedModel, serving

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "name": CLIENT_TOOL,
    "description": "Get the current weather for a location",
    "parameters": {
        "type": "object",
        "properties": {"location": {"type": "string", "description": "City and state"}},
        "required": ["location"],
    },
}
WEATHER_QUESTION = [
    {"type": "message", "role": "user", "content": "What's the weather like in San Francisco?"}
]
# A 1x1 PNG as a data URL: the server must take an image without fetching anything.
PIXEL = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQ"
    "DwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)
TERMINAL = ("response.completed", "response.incomplete", "response.failed", "error")


@pytest.fixture(scope="module")
def check() -> Iterator[Conformance]:
    conformance = Conformance()
    yield conformance
    total = sum(conformance.checked.values())
    print(f"\nOpen Responses checks: validated {total} objects: {conformance.checked}")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, ThreadedModel]]:
    yield from serving(tmp_path_factory.mktemp("open-responses"))


@pytest.fixture
def client(served: tuple[Server, ThreadedModel]) -> openai.OpenAI:
    server, _ = served
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=30)


def _clean(check: Conformance) -> None:
    assert not check.rejects, "\n".join(sorted({r[:400] for r in check.rejects}))


def _streamed(check: Conformance, stream: Any) -> list[Any]:
    events = list(stream)
    for event in events:
        check.event(event)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    return events


def _function_call_events(events: list[dict[str, Any]]) -> None:
    """What the compliance suite asks of a streamed client tool call."""
    types = [e["type"] for e in events]
    added = [e for e in events if e["type"] == "response.output_item.added"]
    done = [e for e in events if e["type"] == "response.output_item.done"]
    assert any(e["item"]["type"] == "function_call" for e in added), types
    assert "response.function_call_arguments.delta" in types, types
    assert "response.function_call_arguments.done" in types, types
    assert any(e["item"]["type"] == "function_call" for e in done), types
    arguments = "".join(
        e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"
    )
    assert json.loads(arguments) == {"location": "San Francisco, CA"}


def test_basic_response(check: Conformance, client: openai.OpenAI) -> None:
    response = client.responses.create(
        model=MODEL,
        input=[{"type": "message", "role": "user", "content": "Say hello in exactly 3 words."}],
    )
    check.response(response)
    assert response.status == "completed" and response.output
    assert response.output_text == "Hello there, friend."
    check.response(client.responses.retrieve(response.id))
    _clean(check)


def test_streaming_response(check: Conformance, client: openai.OpenAI) -> None:
    events = _streamed(
        check,
        client.responses.create(
            model=MODEL,
            input=[{"type": "message", "role": "user", "content": "Count from 1 to 5."}],
            stream=True,
        ),
    )
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == events[-1].response.output_text == "Hello there, friend."
    _clean(check)


def test_system_prompt(
    check: Conformance, client: openai.OpenAI, served: tuple[Server, ThreadedModel]
) -> None:
    pirate = "You are a pirate. Always respond in pirate speak."
    response = client.responses.create(
        model=MODEL,
        input=[
            {"type": "message", "role": "system", "content": pirate},
            {"type": "message", "role": "user", "content": "Say hello."},
        ],
    )
    check.response(response)
    assert response.status == "completed" and response.output_text == "Ahoy, matey!"
    asked = served[1].model.requests[-1]["messages"]
    assert any(m["role"] == "system" and pirate in str(m["content"]) for m in asked)
    _clean(check)


def test_tool_calling_then_its_output_continues_the_chain(
    check: Conformance, client: openai.OpenAI
) -> None:
    response = client.responses.create(model=MODEL, input=WEATHER_QUESTION, tools=[WEATHER_TOOL])
    check.response(response)
    assert response.status == "completed"
    [call] = [item for item in response.output if item.type == "function_call"]
    assert call.name == CLIENT_TOOL and call.status == "completed"
    assert json.loads(call.arguments) == {"location": "San Francisco, CA"}

    answered = client.responses.create(
        model=MODEL,
        previous_response_id=response.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 18 C"}],
        tools=[WEATHER_TOOL],
    )
    check.response(answered)
    assert answered.status == "completed"
    assert answered.output_text == "The weather in San Francisco: sunny, 18 C."
    _clean(check)


def test_tool_calling_in_a_conversation(check: Conformance, client: openai.OpenAI) -> None:
    """``function_call_output`` items answer the park of the conversation they name (no
    ``previous_response_id``): how the openai-agents SDK continues with ``conversation_id``."""
    conversation = client.conversations.create()
    response = client.responses.create(
        model=MODEL, conversation=conversation.id, input=WEATHER_QUESTION, tools=[WEATHER_TOOL]
    )
    check.response(response)
    [call] = [item for item in response.output if item.type == "function_call"]
    with pytest.raises(openai.ConflictError) as refused:
        client.responses.create(model=MODEL, conversation=conversation.id, input="And?")
    assert refused.value.code == "tool_calls_pending"

    output = {"type": "function_call_output", "call_id": call.call_id, "output": "windy"}
    answered = client.responses.create(
        model=MODEL, conversation=conversation.id, input=[output], tools=[WEATHER_TOOL]
    )
    check.response(answered)
    assert answered.output_text == "The weather in San Francisco: windy."
    assert answered.conversation is not None and answered.conversation.id == conversation.id
    with pytest.raises(openai.BadRequestError) as again:
        client.responses.create(model=MODEL, conversation=conversation.id, input=[output])
    assert again.value.code == "no_pending_tool_calls"
    _clean(check)


def test_tool_calling_streaming(check: Conformance, client: openai.OpenAI) -> None:
    events = _streamed(
        check,
        client.responses.create(
            model=MODEL,
            input=WEATHER_QUESTION,
            tools=[WEATHER_TOOL],
            stream=True,
        ),
    )
    _function_call_events([e.to_dict() for e in events])
    final = events[-1]
    assert final.type == "response.completed"
    assert [item.type for item in final.response.output] == ["function_call"]
    _clean(check)


def test_image_input(
    check: Conformance, client: openai.OpenAI, served: tuple[Server, ThreadedModel]
) -> None:
    response = client.responses.create(
        model=MODEL,
        input=[
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "What do you see in this image?"},
                    {"type": "input_image", "image_url": PIXEL, "detail": "auto"},
                ],
            }
        ],
    )
    check.response(response)
    assert response.status == "completed" and response.output
    parts = served[1].model.requests[-1]["messages"][-1]["content"]
    assert {"type": "image_url", "image_url": {"url": PIXEL, "detail": "auto"}} in parts
    _clean(check)


def test_multi_turn(
    check: Conformance, client: openai.OpenAI, served: tuple[Server, ThreadedModel]
) -> None:
    response = client.responses.create(
        model=MODEL,
        input=[
            {"type": "message", "role": "user", "content": "My name is Alice."},
            {"type": "message", "role": "assistant", "content": "Hello Alice! How can I help?"},
            {"type": "message", "role": "user", "content": "What is my name?"},
        ],
    )
    check.response(response)
    assert response.status == "completed" and response.output_text == "Your name is Alice."
    roles = [m["role"] for m in served[1].model.requests[-1]["messages"]][-3:]
    assert roles == ["user", "assistant", "user"]
    _clean(check)


def test_compact(check: Conformance, client: openai.OpenAI) -> None:
    first = client.responses.create(model=MODEL, input="Say hello.")
    check.response(first)
    raw = client.responses.with_raw_response.compact(model=MODEL, previous_response_id=first.id)
    compacted = CompactedResponse.model_validate(raw.http_response.json(), strict=True)
    [item] = compacted.output
    assert item.type == "compaction" and SUMMARY in item.encrypted_content
    nxt = client.responses.create(
        model=MODEL,
        input=[
            {"type": "compaction", "id": item.id, "encrypted_content": item.encrypted_content},
            {"role": "user", "content": "Say hello again."},
        ],
    )
    check.response(nxt)
    assert nxt.status == "completed"
    _clean(check)


async def _ws_create(
    ws: aiohttp.ClientWebSocketResponse, check: Conformance, **create: Any
) -> list[dict[str, Any]]:
    """One ``response.create`` over the socket: its frames up to the terminal one, each
    validated (stream events, or the WebSocket ``error`` event)."""
    await ws.send_json({"type": "response.create", "model": MODEL, **create})
    frames: list[dict[str, Any]] = []
    while True:
        message = await ws.receive(timeout=30)
        assert message.type == aiohttp.WSMsgType.TEXT, message
        frame = json.loads(message.data)
        if frame["type"] == "error":
            check._check(
                "ResponseWsError",
                frame,
                lambda d: ResponseWsError.model_validate(d, strict=True),
                set(),
            )
            return [*frames, frame]
        check.event(frame)
        frames.append(frame)
        if frame["type"] in TERMINAL:
            assert [f["sequence_number"] for f in frames] == list(range(len(frames)))
            return frames


async def _over_websocket(url: str, check: Conformance) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    async with aiohttp.ClientSession() as http, http.ws_connect(url, headers=headers) as ws:
        frames = await _ws_create(ws, check, input="Say hello in exactly 3 words.")
        final = Response.model_validate(frames[-1]["response"])
        assert final.status == "completed" and final.output_text == "Hello there, friend."

        pirate = [
            {"type": "message", "role": "system", "content": "You are a pirate."},
            {"type": "message", "role": "user", "content": "Say hello."},
        ]
        frames = await _ws_create(ws, check, input=pirate)
        assert Response.model_validate(frames[-1]["response"]).output_text == "Ahoy, matey!"

        frames = await _ws_create(ws, check, input=WEATHER_QUESTION, tools=[WEATHER_TOOL])
        _function_call_events(frames)
        asked = Response.model_validate(frames[-1]["response"])
        [call] = [item for item in asked.output if item.type == "function_call"]
        output = {"type": "function_call_output", "call_id": call.call_id, "output": "fog"}
        frames = await _ws_create(
            ws, check, previous_response_id=asked.id, input=[output], tools=[WEATHER_TOOL]
        )
        answered = Response.model_validate(frames[-1]["response"])
        assert answered.output_text == "The weather in San Francisco: fog."

        frames = await _ws_create(
            ws,
            check,
            input=[
                {
                    "type": "message",
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "What is in it?"},
                        {"type": "input_image", "image_url": PIXEL},
                    ],
                }
            ],
        )
        assert frames[-1]["type"] == "response.completed"

        multi = [
            {"type": "message", "role": "user", "content": "My name is Alice."},
            {"type": "message", "role": "assistant", "content": "Hello Alice!"},
            {"type": "message", "role": "user", "content": "What is my name?"},
        ]
        frames = await _ws_create(ws, check, input=multi)
        assert frames[-1]["response"]["output"][0]["content"][0]["text"] == "Your name is Alice."

        # A refused create is an error event, and the socket stays open for the next one.
        frames = await _ws_create(ws, check, input="hi", frobnicate=1)
        assert frames[-1]["type"] == "error"
        frames = await _ws_create(ws, check, input="Say hello.")
        assert frames[-1]["type"] == "response.completed"


def test_the_same_over_websocket_mode(
    check: Conformance, served: tuple[Server, ThreadedModel]
) -> None:
    asyncio.run(_over_websocket(f"{served[0].url}/v1/responses", check))
    _clean(check)
