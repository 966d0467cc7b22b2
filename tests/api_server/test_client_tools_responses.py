"""Issue 34 item 1 on ``/v1/responses``: client function tools with the official ``openai``
client, streaming and not, in the background too; the client continues with
``function_call_output`` items and ``previous_response_id``. Also a fake OpenAI-compatible
upstream whose model calls the client's tool (and a colliding name mapped back)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from agent.providers.demo import DemoModel
from agent.providers.openai_compat import OpenAICompatProvider
from gateway.responses import ResponsesService
from gateway.surfaces.api_server.adapter import ApiServerAdapter
from tests.agent.test_openai_compat import FakeOpenAI, _chunk, sse
from tests.api_server._support import DEMO_DELAY, KEY, client_for, demo_agent, poll
from tests.api_server.test_client_tools import ToolsSeen
from tests.api_server.test_responses import responses_backend

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
ASK = 'call client tool get_weather with {"city": "Lima"}'


async def _serve(store: Any, directory: Path, provider: Any) -> tuple[ApiServerAdapter, Any]:
    adapter = ApiServerAdapter(
        store=store,
        agent=demo_agent(provider),
        host="127.0.0.1",
        port=0,
        api_key=KEY,
        model_name=provider.name,
    )
    service = ResponsesService(responses_backend("sqlite", directory), adapter.turns)
    adapter.mount_responses(service)
    await adapter.start()
    await service.start()
    return adapter, service


@pytest.fixture
async def served(store, tmp_path) -> AsyncIterator[tuple[ApiServerAdapter, ToolsSeen]]:
    provider = ToolsSeen(DemoModel(delay_seconds=DEMO_DELAY))
    adapter, service = await _serve(store, tmp_path, provider)
    try:
        yield adapter, provider
    finally:
        await service.stop(grace_seconds=1)
        await adapter.stop()


def _calls(response: Any) -> list[Any]:
    return [item for item in response.output if item.type == "function_call"]


async def test_a_responses_round_trip_with_function_call_output(served) -> None:
    adapter, provider = served
    client = client_for(adapter.port)
    first = await client.responses.create(model="reveille-demo", input=ASK, tools=[WEATHER])
    assert first.status == "completed"
    calls = _calls(first)
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].status == "completed"
    assert json.loads(calls[0].arguments) == {"city": "Lima"}
    assert "get_weather" in provider.offered[0] and "delegate_task" in provider.offered[0]

    second = await client.responses.create(
        model="reveille-demo",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "fog"}],
        tools=[WEATHER],
    )
    assert second.status == "completed"
    assert "fog" in second.output_text
    assert not _calls(second)


async def test_a_streamed_responses_round_trip_sends_function_call_events(served) -> None:
    adapter, _ = served
    client = client_for(adapter.port)
    stream = await client.responses.create(
        model="reveille-demo", input=ASK, tools=[WEATHER], stream=True
    )
    kinds: list[str] = []
    final = None
    arguments = ""
    async for event in stream:
        kinds.append(event.type)
        if event.type == "response.function_call_arguments.delta":
            arguments += event.delta
        if event.type == "response.completed":
            final = event.response
    for kind in (
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ):
        assert kind in kinds
    assert json.loads(arguments) == {"city": "Lima"}
    assert final is not None
    call = _calls(final)[0]

    stream = await client.responses.create(
        model="reveille-demo",
        previous_response_id=final.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "hail"}],
        tools=[WEATHER],
        stream=True,
    )
    text = ""
    async for event in stream:
        if event.type == "response.output_text.delta":
            text += event.delta
    assert "hail" in text


async def test_responses_errors_while_a_call_is_pending(served) -> None:
    adapter, _ = served
    client = client_for(adapter.port)
    first = await client.responses.create(model="reveille-demo", input=ASK, tools=[WEATHER])
    with pytest.raises(openai.ConflictError) as caught:
        await client.responses.create(
            model="reveille-demo", previous_response_id=first.id, input="something else"
        )
    assert caught.value.body["code"] == "tool_calls_pending"
    with pytest.raises(openai.BadRequestError) as bad:
        await client.responses.create(
            model="reveille-demo",
            previous_response_id=first.id,
            input=[{"type": "function_call_output", "call_id": "call_nope", "output": "x"}],
        )
    assert bad.value.body["code"] == "unknown_call_id"
    with pytest.raises(openai.BadRequestError) as none:
        await client.responses.create(
            model="reveille-demo",
            input=[{"type": "function_call_output", "call_id": "call_x", "output": "x"}],
        )
    assert none.value.body["code"] == "no_pending_tool_calls"
    with pytest.raises(openai.BadRequestError) as search:
        await client.responses.create(
            model="reveille-demo", input="hi", tools=[{"type": "web_search"}]
        )
    assert search.value.body["param"] == "tools"


async def test_a_background_response_ends_completed_with_its_call(served) -> None:
    adapter, _ = served
    client = client_for(adapter.port)
    queued = await client.responses.create(
        model="reveille-demo", input=ASK, tools=[WEATHER], background=True
    )

    async def done() -> Any:
        found = await client.responses.retrieve(queued.id)
        return found if found.status == "completed" else None

    first = await poll(done)
    call = _calls(first)[0]
    assert call.name == "get_weather"
    chained = await client.responses.create(
        model="reveille-demo",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "dust"}],
        background=True,
    )

    async def chained_done() -> Any:
        found = await client.responses.retrieve(chained.id)
        return found if found.status == "completed" else None

    assert "dust" in (await poll(chained_done)).output_text


async def test_a_fake_upstream_calls_a_colliding_client_tool_mapped_back(store, tmp_path) -> None:
    fake = FakeOpenAI()
    await fake.start()
    call = {
        "id": "call_up_1",
        "type": "function",
        "function": {"name": "client__delegate_task", "arguments": '{"goal": "mine"}'},
    }
    # Responses turns stream from the upstream: the call comes as tool-call deltas.
    delta = {"tool_calls": [{"index": 0, **call}]}
    fake.script = [
        sse(_chunk(delta), _chunk({}, finish_reason="tool_calls")),
        sse(_chunk({"role": "assistant", "content": "done: thanks"}), _chunk({}, "stop")),
    ]
    provider = OpenAICompatProvider(fake.base_url, "sk-up", "fake-model", 10.0, max_retries=0)
    adapter, service = await _serve(store, tmp_path, provider)
    try:
        mine = {"type": "function", "name": "delegate_task", "parameters": {"type": "object"}}
        client = client_for(adapter.port)
        first = await client.responses.create(model="fake-model", input="go", tools=[mine])
        offered = [t["function"]["name"] for t in fake.requests[0]["body"]["tools"]]
        assert "client__delegate_task" in offered and "delegate_task" in offered
        found = _calls(first)[0]
        assert (found.name, found.call_id) == ("delegate_task", "call_up_1")
        second = await client.responses.create(
            model="fake-model",
            previous_response_id=first.id,
            input=[{"type": "function_call_output", "call_id": "call_up_1", "output": "ok"}],
            tools=[mine],
        )
        assert second.output_text == "done: thanks"
        sent = fake.requests[1]["body"]["messages"]
        assert sent[-1] == {"role": "tool", "tool_call_id": "call_up_1", "content": "ok"}
        assert sent[-2]["tool_calls"][0]["function"]["name"] == "client__delegate_task"
    finally:
        await service.stop(grace_seconds=1)
        await adapter.stop()
        await provider.aclose()
        await fake.stop()


async def test_server_tools_off_on_responses(served) -> None:
    adapter, provider = served
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"http://127.0.0.1:{adapter.port}/v1/responses",
            json={"model": "reveille-demo", "input": ASK, "tools": [WEATHER]},
            headers={"Authorization": f"Bearer {KEY}", "X-Reveille-Server-Tools": "off"},
        ) as response,
    ):
        body = await response.json()
    assert response.status == 200, body
    assert provider.offered[0] == ["get_weather"]
    assert body["output"][-1]["type"] == "function_call"


async def test_a_replayed_stream_tells_the_function_call_again(served) -> None:
    adapter, _ = served
    client = client_for(adapter.port)
    body = {"model": "reveille-demo", "input": ASK, "tools": [WEATHER]}
    key = {"Idempotency-Key": "replay-1"}
    first = await client.responses.create(**body, extra_headers=key)
    stream = await client.responses.create(**body, stream=True, extra_headers=key)
    kinds = [event.type async for event in stream]
    assert "response.function_call_arguments.done" in kinds
    assert kinds[-1] == "response.completed"
    assert _calls(first)


async def test_responses_tool_choice_names_the_model_side_tool(served) -> None:
    adapter, provider = served
    mine = {"type": "function", "name": "delegate_task", "parameters": {"type": "object"}}
    client = client_for(adapter.port)
    await client.responses.create(
        model="reveille-demo",
        input="hello",
        tools=[mine, WEATHER],
        tool_choice={"type": "function", "name": "delegate_task"},
    )
    assert provider.choices[0] == {
        "type": "function",
        "function": {"name": "client__delegate_task"},
    }
    await client.responses.create(
        model="reveille-demo",
        input="hello",
        tools=[mine, WEATHER],
        tool_choice={
            "type": "allowed_tools",
            "mode": "auto",
            "tools": [{"type": "function", "name": "get_weather"}],
        },
    )
    assert provider.offered[-1] == ["get_weather"]


async def test_input_items_list_the_calls_and_their_outputs(served) -> None:
    from openai.types.responses import (
        ResponseFunctionToolCallItem,
        ResponseFunctionToolCallOutputItem,
    )

    adapter, _ = served
    client = client_for(adapter.port)
    first = await client.responses.create(model="reveille-demo", input=ASK, tools=[WEATHER])
    (call,) = _calls(first)
    echoed = {
        "type": "function_call",
        "id": call.id,
        "call_id": call.call_id,
        "name": call.name,
        "arguments": call.arguments,
    }
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "drizzle"}
    second = await client.responses.create(
        model="reveille-demo",
        previous_response_id=first.id,
        input=[echoed, output],  # type: ignore[list-item]
        tools=[WEATHER],
    )
    assert "drizzle" in second.output_text
    items = (await client.responses.input_items.list(second.id, order="asc")).data
    assert [type(item) for item in items] == [
        ResponseFunctionToolCallItem,
        ResponseFunctionToolCallOutputItem,
    ]
    listed_call, listed_output = items
    assert isinstance(listed_call, ResponseFunctionToolCallItem)
    assert (listed_call.id, listed_call.call_id, listed_call.name) == (
        call.id,
        call.call_id,
        "get_weather",
    )
    assert listed_call.arguments == call.arguments
    assert isinstance(listed_output, ResponseFunctionToolCallOutputItem)
    assert listed_output.call_id == call.call_id and listed_output.output == "drizzle"
    assert listed_output.id.startswith("fco_") and listed_output.status == "completed"
    # The first response's input is its message alone.
    (message,) = (await client.responses.input_items.list(first.id)).data
    assert message.type == "message"


async def test_a_malformed_echoed_function_call_is_a_400(served) -> None:
    adapter, _ = served
    client = client_for(adapter.port)
    first = await client.responses.create(model="reveille-demo", input=ASK, tools=[WEATHER])
    (call,) = _calls(first)
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(
            model="reveille-demo",
            previous_response_id=first.id,
            input=[
                {"type": "function_call", "call_id": call.call_id, "name": 7},  # type: ignore[list-item]
                {"type": "function_call_output", "call_id": call.call_id, "output": "x"},
            ],
            tools=[WEATHER],
        )
    assert caught.value.body["param"] == "input[0].name"  # type: ignore[index]
    # Nothing was lost: the park still waits and the right results resume it.
    second = await client.responses.create(
        model="reveille-demo",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sun"}],
        tools=[WEATHER],
    )
    assert "sun" in second.output_text
