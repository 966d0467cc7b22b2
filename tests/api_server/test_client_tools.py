"""Issue 34 item 1: client-defined function tools beside the server's own, over the
official ``openai`` client: the call comes back pending (chat ``tool_calls``), the turn is
parked in the session's transcript, and the client resumes it with ``role: "tool"``.

The demo model calls a client tool when told ``call client tool <name> with <JSON>`` and
answers with the result once it has it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from agent.providers.demo import DemoModel
from gateway.surfaces.api_server.adapter import ApiServerAdapter
from gateway.turns.client_calls import find_parked

from ._support import DEMO_DELAY, KEY, RecordingProvider, client_for, demo_agent, poll

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "the weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
ASK = 'call client tool get_weather with {"city": "Paris"}'


class ToolsSeen(RecordingProvider):
    """Records, besides each context, the tool names each model call was offered."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.offered: list[list[str]] = []
        self.choices: list[Any] = []

    async def complete(self, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
        self.offered.append([t["function"]["name"] for t in kwargs.get("tools") or []])
        options = kwargs.get("options")
        self.choices.append(options.tool_choice if options is not None else None)
        return await super().complete(messages, **kwargs)


@pytest.fixture
async def served(store) -> AsyncIterator[tuple[ApiServerAdapter, ToolsSeen]]:
    provider = ToolsSeen(DemoModel(delay_seconds=DEMO_DELAY))
    adapter = ApiServerAdapter(
        store=store,
        agent=demo_agent(provider),
        host="127.0.0.1",
        port=0,
        api_key=KEY,
        model_name=provider.name,
    )
    await adapter.start()
    try:
        yield adapter, provider
    finally:
        await adapter.stop()


def _resumed(first: Any, output: str) -> list[dict[str, Any]]:
    message = first.choices[0].message
    call = message.tool_calls[0]
    return [
        {"role": "user", "content": ASK},
        {
            "role": "assistant",
            "content": message.content,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": call.function.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": output},
    ]


async def test_a_chat_round_trip_hands_the_call_back_and_resumes_with_its_result(
    served, store
) -> None:
    adapter, provider = served
    client = client_for(adapter.port)
    first = await client.chat.completions.create(
        model="reveille-demo", messages=[{"role": "user", "content": ASK}], tools=[WEATHER]
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    # Offered beside the server's own tools.
    assert "get_weather" in provider.offered[0] and "delegate_task" in provider.offered[0]
    sessions = store.list_sessions()
    assert len(sessions) == 1
    parked = await find_parked(store, sessions[0].id)
    assert parked is not None and parked.call_ids == [call.id]

    second = await client.chat.completions.create(
        model="reveille-demo", messages=_resumed(first, "sunny, 21 C"), tools=[WEATHER]
    )
    assert second.choices[0].finish_reason == "stop"
    assert "sunny, 21 C" in (second.choices[0].message.content or "")
    assert len(store.list_sessions()) == 1  # the same conversation, resumed
    assert await find_parked(store, sessions[0].id) is None
    # The model was shown its call and the client's result, once.
    last = provider.contexts[-1]
    assert [m["role"] for m in last[-2:]] == ["assistant", "tool"]
    assert last[-1]["content"] == "sunny, 21 C"


async def test_a_streamed_round_trip_sends_tool_call_deltas(served, store) -> None:
    adapter, _ = served
    client = client_for(adapter.port)
    stream = await client.chat.completions.create(
        model="reveille-demo",
        messages=[{"role": "user", "content": ASK}],
        tools=[WEATHER],
        stream=True,
    )
    calls: dict[int, dict[str, str]] = {}
    finish = None
    async for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        for part in delta.tool_calls or []:
            entry = calls.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
            entry["id"] = part.id or entry["id"]
            if part.function is not None:
                entry["name"] += part.function.name or ""
                entry["arguments"] += part.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert calls[0]["name"] == "get_weather"
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris"}

    messages = [
        {"role": "user", "content": ASK},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": calls[0]["id"],
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": calls[0]["arguments"]},
                }
            ],
        },
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": "rain"},
    ]
    stream = await client.chat.completions.create(
        model="reveille-demo", messages=messages, tools=[WEATHER], stream=True
    )
    text = ""
    async for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "stop"
    assert "rain" in text


async def test_a_client_tool_named_like_a_server_tool_is_renamed_and_mapped_back(
    served, store
) -> None:
    adapter, provider = served
    mine = {"type": "function", "function": {"name": "delegate_task", "parameters": {}}}
    first = await client_for(adapter.port).chat.completions.create(
        model="reveille-demo",
        messages=[{"role": "user", "content": 'call client tool delegate_task with {"x": 1}'}],
        tools=[mine],
    )
    assert "client__delegate_task" in provider.offered[0]
    assert "delegate_task" in provider.offered[0]  # the server's own, too
    call = first.choices[0].message.tool_calls[0]
    assert call.function.name == "delegate_task"  # the client's name
    assert first.choices[0].finish_reason == "tool_calls"


async def test_server_tools_off_offers_only_the_clients(served) -> None:
    adapter, provider = served
    first = await client_for(adapter.port).chat.completions.create(
        model="reveille-demo",
        messages=[{"role": "user", "content": ASK}],
        tools=[WEATHER],
        extra_headers={"X-Reveille-Server-Tools": "off"},
    )
    assert provider.offered[0] == ["get_weather"]
    assert first.choices[0].finish_reason == "tool_calls"


async def _post(port: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {KEY}"},
        ) as response,
    ):
        return response.status, await response.json()


async def test_a_new_message_while_calls_are_pending_is_a_409_and_bad_results_400(
    served, store
) -> None:
    adapter, _ = served
    client = client_for(adapter.port)
    first = await client.chat.completions.create(
        model="reveille-demo", messages=[{"role": "user", "content": ASK}], tools=[WEATHER]
    )
    call_id = first.choices[0].message.tool_calls[0].id
    base = _resumed(first, "x")[:2]
    status, body = await _post(
        adapter.port,
        {"model": "reveille-demo", "messages": [*base, {"role": "user", "content": "never mind"}]},
    )
    assert status == 409 and body["error"]["code"] == "tool_calls_pending", body
    status, body = await _post(
        adapter.port,
        {
            "model": "reveille-demo",
            "messages": [*base, {"role": "tool", "tool_call_id": "nope", "content": "?"}],
        },
    )
    assert status == 400 and body["error"]["code"] == "unknown_call_id", body
    # Nothing was lost: the park still waits for its call.
    parked = await find_parked(store, store.list_sessions()[0].id)
    assert parked is not None and parked.call_ids == [call_id]

    other = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": None, "tool_calls": base[1]["tool_calls"]},
        {"role": "tool", "tool_call_id": call_id, "content": "x"},
    ]
    status, body = await _post(adapter.port, {"model": "reveille-demo", "messages": other})
    assert status == 400 and body["error"]["code"] == "no_pending_tool_calls", body


async def test_a_new_message_after_the_deadline_gives_the_agent_an_error_result(
    served, store
) -> None:
    adapter, provider = served
    adapter.turns.client_tool_timeout = 0.0
    client = client_for(adapter.port)
    first = await client.chat.completions.create(
        model="reveille-demo", messages=[{"role": "user", "content": ASK}], tools=[WEATHER]
    )
    call_id = first.choices[0].message.tool_calls[0].id
    nxt = await client.chat.completions.create(
        model="reveille-demo",
        messages=[*_resumed(first, "")[:2], {"role": "user", "content": "and now?"}],
    )
    assert nxt.choices[0].finish_reason == "stop"
    context = provider.contexts[-1]
    assert [m["role"] for m in context[-3:]] == ["assistant", "tool", "user"]
    assert context[-2]["tool_call_id"] == call_id
    assert "did not return a result" in context[-2]["content"]
    assert context[-1]["content"] == "and now?"
    # Told once: the next turn has the note in the transcript, not the exchange again.
    await client.chat.completions.create(
        model="reveille-demo",
        messages=[
            *_resumed(first, "")[:2],
            {"role": "user", "content": "and now?"},
            {"role": "assistant", "content": nxt.choices[0].message.content},
            {"role": "user", "content": "ok"},
        ],
    )
    assert not any(m["role"] == "tool" for m in provider.contexts[-1])
    assert len(store.list_sessions()) == 1


async def test_a_park_past_its_deadline_frees_the_session(served, store) -> None:
    adapter, _ = served
    adapter.turns.client_tool_timeout = 0.0
    client = client_for(adapter.port)
    first = await client.chat.completions.create(
        model="reveille-demo", messages=[{"role": "user", "content": ASK}], tools=[WEATHER]
    )
    base = _resumed(first, "late")
    # The results come too late: nobody waits for them any more.
    status, body = await _post(adapter.port, {"model": "reveille-demo", "messages": base})
    assert status == 400 and body["error"]["code"] == "no_pending_tool_calls", body
    # And a new message goes on, the agent told that the calls got no result.
    nxt = await client.chat.completions.create(
        model="reveille-demo",
        messages=[*base[:2], {"role": "user", "content": "and now?"}],
    )
    assert nxt.choices[0].finish_reason == "stop"
    assert len(store.list_sessions()) == 1
    # The late results' request ended the park: the transcript says so, once.
    rows = store.messages(store.list_sessions()[0].id)
    assert len([row for row in rows if "did not return results" in row.content]) == 1


@pytest.mark.parametrize("kind", ["sqlite", "memory", "postgres"])
async def test_every_backend_keeps_the_park(kind: str, tmp_path) -> None:
    from gateway.session import SessionStore
    from tests.pg_support import fresh_url
    from tests.stores import memory_sessions, pg_sessions, sqlite_sessions

    if kind == "sqlite":
        backend = sqlite_sessions(tmp_path / "sessions.db")
    elif kind == "memory":
        backend = memory_sessions()
    else:
        backend = pg_sessions(fresh_url())
    store = SessionStore(backend)
    provider = ToolsSeen(DemoModel(delay_seconds=DEMO_DELAY))
    adapter = ApiServerAdapter(
        store=store, agent=demo_agent(provider), port=0, api_key=KEY, model_name=provider.name
    )
    await adapter.start()
    try:
        client = client_for(adapter.port)
        first = await client.chat.completions.create(
            model="reveille-demo", messages=[{"role": "user", "content": ASK}], tools=[WEATHER]
        )
        session_id = store.list_sessions()[0].id
        parked = await find_parked(store, session_id)
        assert parked is not None and parked.call_ids == [first.choices[0].message.tool_calls[0].id]
        second = await client.chat.completions.create(
            model="reveille-demo", messages=_resumed(first, "mist"), tools=[WEATHER]
        )
        assert "mist" in (second.choices[0].message.content or "")
        assert await find_parked(store, session_id) is None
    finally:
        await adapter.stop()
        store.close()


async def test_allowed_tools_narrow_what_the_model_is_offered(served) -> None:
    adapter, provider = served
    other = {"type": "function", "function": {"name": "get_time", "parameters": {}}}
    await client_for(adapter.port).chat.completions.create(
        model="reveille-demo",
        messages=[{"role": "user", "content": ASK}],
        tools=[WEATHER, other],
        tool_choice={
            "type": "allowed_tools",
            "allowed_tools": {
                "mode": "auto",
                "tools": [
                    {"type": "function", "function": {"name": "get_weather"}},
                    {"type": "function", "function": {"name": "delegate_task"}},
                ],
            },
        },
    )
    assert sorted(provider.offered[0]) == ["delegate_task", "get_weather"]


async def test_a_wake_up_waits_behind_a_parked_call(served, store) -> None:
    from gateway.turns.service import TurnError, TurnRequest

    adapter, _ = served
    await client_for(adapter.port).chat.completions.create(
        model="reveille-demo", messages=[{"role": "user", "content": ASK}], tools=[WEATHER]
    )
    session_id = store.list_sessions()[0].id
    wake = TurnRequest(
        session_id=session_id, messages=[{"role": "user", "content": "a result"}], wakeup=True
    )
    with pytest.raises(TurnError) as caught:
        await adapter.turns.start(wake)
    # A wait (the wake-up is offered again later), not a refusal that spends an attempt.
    assert caught.value.kind == "session_busy"
    assert await find_parked(store, session_id) is not None


def test_the_client_timeout_from_file_and_environment(tmp_path) -> None:
    from reveille.settings import SettingsError, load_settings

    home = {"REVEILLE_HOME": str(tmp_path)}
    assert load_settings(home).client_tool_timeout == 600.0
    (tmp_path / "config.toml").write_text("[tools]\nclient_timeout = 90\n")
    assert load_settings(home).client_tool_timeout == 90.0
    assert load_settings({**home, "REVEILLE_CLIENT_TOOL_TIMEOUT": "5"}).client_tool_timeout == 5.0
    with pytest.raises(SettingsError, match=r"client_timeout|CLIENT_TOOL_TIMEOUT"):
        load_settings({**home, "REVEILLE_CLIENT_TOOL_TIMEOUT": "0"})


async def test_the_conversation_goes_on_after_a_resumed_turn(served, store) -> None:
    adapter, provider = served
    client = client_for(adapter.port)
    first = await client.chat.completions.create(
        model="reveille-demo", messages=[{"role": "user", "content": ASK}], tools=[WEATHER]
    )
    resumed = _resumed(first, "clear skies")
    second = await client.chat.completions.create(
        model="reveille-demo", messages=resumed, tools=[WEATHER]
    )
    answer = second.choices[0].message.content
    later = [
        *resumed,
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "thanks"},
    ]
    # A client that resends its whole history (no session header) lands in the same session.
    third = await client.chat.completions.create(
        model="reveille-demo", messages=later, tools=[WEATHER]
    )
    assert third.choices[0].finish_reason == "stop"
    assert len(store.list_sessions()) == 1
    context = provider.contexts[-1]
    assert [m["role"] for m in context if m["role"] != "system"] == ["user", "assistant", "user"]
    assert context[-2]["content"] == answer


async def test_a_small_context_bound_keeps_the_call_and_its_result_together(served) -> None:
    adapter, provider = served
    adapter.turns.context_chars = 400
    client = client_for(adapter.port)
    opening = [{"role": "user", "content": "tell me about " + "clouds " * 300}]
    reply = await client.chat.completions.create(model="reveille-demo", messages=opening)
    history = [
        *opening,
        {"role": "assistant", "content": reply.choices[0].message.content},
        {"role": "user", "content": ASK},
    ]
    first = await client.chat.completions.create(
        model="reveille-demo", messages=history, tools=[WEATHER]
    )
    resumed = _resumed(first, "ok")
    await client.chat.completions.create(
        model="reveille-demo", messages=[*history[:2], *resumed], tools=[WEATHER]
    )
    context = provider.contexts[-1]
    assert [m["role"] for m in context[-2:]] == ["assistant", "tool"]
    assert context[-2]["tool_calls"][0]["id"] == context[-1]["tool_call_id"]
    assert any("left out" in str(m.get("content")) for m in context)  # the bound did cut


async def test_a_server_call_in_the_same_step_runs_first_and_is_not_handed_back(store) -> None:
    from agent.loop import Agent
    from agent.providers import OpenAICompatProvider
    from agent.tools import Tool, ToolRegistry
    from tests.agent.test_openai_compat import FakeOpenAI, completion

    ran: list[dict[str, Any]] = []

    async def lookup(args: dict[str, Any], ctx: Any) -> str:
        ran.append(args)
        return "server says 42"

    fake = FakeOpenAI()
    await fake.start()
    both = [
        {"id": "call_s", "type": "function", "function": {"name": "lookup", "arguments": "{}"}},
        {
            "id": "call_c",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
        },
    ]
    fake.script = [completion(None, both, "tool_calls"), completion("42 and warm")]
    provider = OpenAICompatProvider(fake.base_url, "sk-up", "fake-model", 10.0, max_retries=0)
    registry = ToolRegistry([Tool("lookup", "look up", {"type": "object"}, lookup)])
    adapter = ApiServerAdapter(
        store=store, agent=Agent(provider, registry), port=0, api_key=KEY, model_name="fake-model"
    )
    await adapter.start()
    try:
        client = client_for(adapter.port)
        ask = [{"role": "user", "content": "weather and lookup"}]
        first = await client.chat.completions.create(
            model="fake-model", messages=ask, tools=[WEATHER]
        )
        calls = first.choices[0].message.tool_calls
        assert [c.id for c in calls] == ["call_c"]  # only the client's
        assert ran == [{}]  # the server's ran already
        resumed = [
            *ask,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [c.model_dump(exclude_none=True) for c in calls],
            },
            {"role": "tool", "tool_call_id": "call_c", "content": "warm"},
        ]
        second = await client.chat.completions.create(
            model="fake-model", messages=resumed, tools=[WEATHER]
        )
        assert second.choices[0].message.content == "42 and warm"
        sent = fake.requests[1]["body"]["messages"]
        assert [m["role"] for m in sent[-3:]] == ["assistant", "tool", "tool"]
        assert {m["tool_call_id"]: m["content"] for m in sent[-2:]} == {
            "call_s": "server says 42",
            "call_c": "warm",
        }
        assert ran == [{}]  # not run again on resume
    finally:
        await adapter.stop()
        await provider.aclose()
        await fake.stop()


async def test_the_park_is_found_behind_many_delivery_rows(served, store) -> None:
    adapter, _ = served
    first = await client_for(adapter.port).chat.completions.create(
        model="reveille-demo", messages=[{"role": "user", "content": ASK}], tools=[WEATHER]
    )
    session_id = store.list_sessions()[0].id
    for index in range(30):  # results that came while the turn waited
        store.append_message(
            session_id, "system", f"result {index}", display_kind="async_delegation_complete"
        )
    parked = await find_parked(store, session_id)
    assert parked is not None
    assert parked.call_ids == [first.choices[0].message.tool_calls[0].id]


async def test_tools_that_would_collide_once_namespaced_are_a_400(served) -> None:
    adapter, _ = served
    tools = [
        {"type": "function", "function": {"name": "delegate_task"}},
        {"type": "function", "function": {"name": "client__delegate_task"}},
    ]
    status, body = await _post(
        adapter.port,
        {"model": "reveille-demo", "messages": [{"role": "user", "content": "hi"}], "tools": tools},
    )
    assert status == 400 and body["error"]["param"] == "tools", body


@pytest.mark.parametrize("name", ["lookup\n", "", "a b", "x" * 65, "caf\u00e9"])
async def test_a_tool_name_outside_the_allowed_characters_is_a_400(served, name: str) -> None:
    # A trailing newline too: the name is matched whole, not up to a line's end.
    adapter, _ = served
    status, body = await _post(
        adapter.port,
        {
            "model": "reveille-demo",
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": name}}],
        },
    )
    assert status == 400 and body["error"]["param"] == "tools", body


async def _parked_past_deadline(adapter: ApiServerAdapter, store: Any) -> tuple[str, str]:
    """A park whose deadline passes a second later: (its session, its call id)."""
    adapter.turns.client_tool_timeout = 1.0
    first = await client_for(adapter.port).chat.completions.create(
        model="reveille-demo", messages=[{"role": "user", "content": ASK}], tools=[WEATHER]
    )
    return store.list_sessions()[0].id, first.choices[0].message.tool_calls[0].id


async def test_the_sweep_ends_a_park_past_its_deadline_and_what_waited_is_delivered(
    served, store
) -> None:
    adapter, provider = served
    session_id, call_id = await _parked_past_deadline(adapter, store)
    # A background result that came while the turn waited: held behind the park.
    store.append_message(
        session_id,
        "system",
        "background result: the nightly build passed",
        display_kind="async_delegation_complete",
    )

    async def ended() -> bool:
        return await find_parked(store, session_id) is None

    # Nobody sends a request: the server's sweep ends the park once past its deadline.
    await poll(ended)
    await poll(lambda: not adapter.turns.active_runs)
    context = provider.contexts[-1]
    (told,) = [m for m in context if m["role"] == "tool"]
    assert told["tool_call_id"] == call_id and "did not return a result" in told["content"]
    assert any("nightly build passed" in str(m.get("content")) for m in context)
    # The turn finished and was stored; the session is free: a wake-up runs at once.
    from gateway.turns.service import TurnRequest

    wake = TurnRequest(
        session_id=session_id, messages=[{"role": "user", "content": "a result"}], wakeup=True
    )
    started = await adapter.turns.start(wake)
    await started.task  # type: ignore[union-attr]
    # The agent was told once: the wake-up's model sees no tool exchange again.
    assert not any(m["role"] == "tool" for m in provider.contexts[-1])
