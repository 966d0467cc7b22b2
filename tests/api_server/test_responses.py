"""The Responses API with the official ``openai`` client against a real server on loopback.

The model is ``FakeOpenAI`` (an OpenAI-compatible upstream on loopback) whose streamed
answers wait on a gate the test opens, so "slow" is a state the test controls, not a time;
the demo model where the test reads the model's context (``RecordingProvider``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web

import storage
from agent import Agent
from agent.markers import DELIVERY_MARKER
from agent.providers.demo import DemoModel
from agent.providers.openai_compat import OpenAICompatProvider
from gateway.responses import ResponsesService
from gateway.session import SessionStore
from gateway.surfaces.api_server.adapter import ApiServerAdapter, agent_turn_runner
from gateway.wake import persist_delegation_delivery
from tests.agent.test_openai_compat import FakeOpenAI, _chunk
from tests.api_server._support import KEY, RecordingProvider, client_for, poll
from tools.toolset import build_default_registry

RESULT = {
    "type": "async_delegation",
    "delegation_id": "deleg_stars",
    "goal": "count the stars",
    "status": "completed",
    "summary": "There are 1,234 stars.",
}


class Gate:
    """A streamed upstream answer: "Hello", then (once ``open``) " world" and the end."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()
        self.started = asyncio.Event()

    def handler(self) -> Any:
        async def handle(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(_sse(_chunk({"role": "assistant", "content": "Hello"})))
            self.started.set()
            await self.opened.wait()
            with contextlib.suppress(ConnectionError):
                await response.write(_sse(_chunk({"content": " world"})))
                await response.write(_sse(_chunk({}, finish_reason="stop")))
                await response.write(b"data: [DONE]\n\n")
                await response.write_eof()
            return response

        return handle


def _sse(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


def responses_backend(kind: str, directory: Path) -> Any:
    if kind == "sqlite":
        return storage.sqlite_files(responses=directory / "responses.db").open_responses()
    if kind == "memory":
        return storage.open_storage("memory://").open_responses()
    from tests.pg_support import fresh_url

    return storage.open_storage(fresh_url()).open_responses()


@contextlib.asynccontextmanager
async def serving(
    store: SessionStore,
    directory: Path,
    provider: Any,
    *,
    api_key: str = KEY,
    hook: Any = None,
    service_options: dict[str, Any] | None = None,
    **kwargs: Any,
) -> AsyncIterator[tuple[ApiServerAdapter, ResponsesService]]:
    adapter = ApiServerAdapter(
        store=store,
        turn_runner=agent_turn_runner(
            Agent(provider, build_default_registry(provider, shell_enabled=False))
        ),
        port=0,
        api_key=api_key,
        model_name=provider.name,
        **kwargs,
    )
    service = ResponsesService(
        responses_backend("sqlite", directory),
        adapter.turns,
        on_terminal=hook,
        **(service_options or {}),
    )
    adapter.mount_responses(service)
    await adapter.start()
    await service.start()
    try:
        yield adapter, service
    finally:
        await service.stop(grace_seconds=1)
        await adapter.stop()


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    server = FakeOpenAI()
    await server.start()
    yield server
    await server.stop()


def upstream(fake: FakeOpenAI) -> OpenAICompatProvider:
    return OpenAICompatProvider(fake.base_url, "k", "fake-model", 30.0, max_retries=0)


async def test_background_create_is_queued_then_completes(store, tmp_path, fake) -> None:
    gate = Gate()
    fake.script = [gate.handler()]
    told: list[tuple[str, str]] = []
    async with serving(store, tmp_path, upstream(fake), hook=lambda *a: told.append(a)) as (
        adapter,
        _,
    ):
        client = client_for(adapter.port)
        created = await client.responses.create(
            model="fake-model", input="say hello", background=True, metadata={"k": "v"}
        )
        assert created.status == "queued" and created.background
        await gate.started.wait()
        running = await client.responses.retrieve(created.id)
        assert running.status == "in_progress"
        gate.opened.set()
        done = await poll(lambda: _status(client, created.id, "completed"))
        assert done.output_text == "Hello world"
        assert done.metadata == {"k": "v"} and done.usage is not None
        assert told == [(created.id, "response.completed")]


async def _status(client: openai.AsyncOpenAI, response_id: str, status: str) -> Any:
    found = await client.responses.retrieve(response_id)
    return found if found.status == status else None


async def test_a_dropped_stream_resumes_after_its_last_sequence_number(
    store, tmp_path, fake
) -> None:
    gate = Gate()
    fake.script = [gate.handler()]
    async with serving(store, tmp_path, upstream(fake)) as (adapter, _):
        client = client_for(adapter.port)
        stream = await client.responses.create(
            model="fake-model", input="say hello", background=True, stream=True
        )
        seen = []
        async for event in stream:
            seen.append(event)
            if event.type == "response.output_text.delta":
                break  # the connection drops here
        await stream.close()
        assert [e.sequence_number for e in seen] == list(range(len(seen)))
        assert seen[0].type == "response.created" and seen[-1].delta == "Hello"
        response_id = seen[0].response.id
        gate.opened.set()
        rest = []
        resumed = await client.responses.retrieve(
            response_id, stream=True, starting_after=seen[-1].sequence_number
        )
        async for event in resumed:
            rest.append(event)
        numbers = [e.sequence_number for e in seen + rest]
        assert numbers == list(range(len(numbers)))
        assert rest[-1].type == "response.completed"
        deltas = "".join(e.delta for e in seen + rest if e.type == "response.output_text.delta")
        assert deltas == "Hello world" == rest[-1].response.output_text
        # From the start again: the same events, in the same order.
        again = [e async for e in await client.responses.retrieve(response_id, stream=True)]
        assert [e.type for e in again] == [e.type for e in seen + rest]


async def test_cancel_twice_stops_the_run(store, tmp_path, fake) -> None:
    gate = Gate()
    fake.script = [gate.handler()]
    told: list[tuple[str, str]] = []
    async with serving(store, tmp_path, upstream(fake), hook=lambda *a: told.append(a)) as (
        adapter,
        service,
    ):
        client = client_for(adapter.port)
        created = await client.responses.create(
            model="fake-model", input="never ends", background=True
        )
        await gate.started.wait()
        first = await client.responses.cancel(created.id)
        second = await client.responses.cancel(created.id)
        assert first.status == second.status == "cancelled"
        # The run stopped while the upstream still had not answered.
        await poll(lambda: adapter.turns.background_runs == 0)
        assert not gate.opened.is_set()
        gate.opened.set()
        assert (await client.responses.retrieve(created.id)).status == "cancelled"
        row = await service.get(created.id)
        assert (
            row is not None and store.messages(row.session_id) == []
        )  # nothing of the cancelled turn was stored
        assert told == [(created.id, "response.cancelled")]


async def test_previous_response_id_folds_a_background_result_once(store, tmp_path) -> None:
    provider = RecordingProvider(DemoModel(delay_seconds=0))
    async with serving(store, tmp_path, provider) as (adapter, service):
        client = client_for(adapter.port)
        first = await client.responses.create(model=provider.name, input="hi")
        assert first.status == "completed"
        row = await service.get(first.id)
        assert row is not None
        await asyncio.to_thread(persist_delegation_delivery, store, row.session_id, RESULT)

        other = await client.responses.create(model=provider.name, input="hi")
        assert "1,234" not in _context(provider)  # another chain never sees it
        assert (await service.get(other.id)).session_id != row.session_id  # type: ignore[union-attr]

        second = await client.responses.create(
            model=provider.name, input="and?", previous_response_id=first.id, background=True
        )
        await poll(lambda: _status(client, second.id, "completed"))
        folded = provider.contexts[-1]
        assert folded[-2]["role"] == "system" and DELIVERY_MARKER in folded[-2]["content"]
        assert "1,234" in folded[-2]["content"]

        third = await client.responses.create(
            model=provider.name, input="more?", previous_response_id=second.id
        )
        assert third.previous_response_id == second.id
        # Once: in its place in the history now, never as a new delivery again.
        deliveries = [
            m
            for m in provider.contexts[-1]
            if m["role"] == "system" and DELIVERY_MARKER in str(m["content"])
        ]
        assert len(deliveries) == 1 and "1,234" in deliveries[0]["content"]
        assert provider.contexts[-1][-2] is not deliveries[0]


def _context(provider: RecordingProvider) -> str:
    return "\n".join(str(m["content"]) for m in provider.contexts[-1])


async def test_stream_input_items_and_delete(store, tmp_path) -> None:
    provider = RecordingProvider(DemoModel(delay_seconds=0))
    async with serving(store, tmp_path, provider) as (adapter, _):
        client = client_for(adapter.port)
        stream = await client.responses.create(
            model=provider.name,
            instructions="be brief",
            input=[
                {"role": "user", "content": "first"},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": [{"type": "input_text", "text": "second"}]},
            ],
            stream=True,
        )
        events = [e async for e in stream]
        assert events[0].type == "response.created" and events[-1].type == "response.completed"
        assert [e.sequence_number for e in events] == list(range(len(events)))
        response = events[-1].response
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert text and text == response.output_text
        stored = await client.responses.retrieve(response.id)
        assert stored.status == "completed" and stored.output_text == text

        items = await client.responses.input_items.list(response.id, order="asc")
        assert [i.role for i in items.data] == ["user", "assistant", "user"]
        assert items.data[2].content[0].text == "second"
        page = await client.responses.input_items.list(response.id, limit=1)
        assert page.data[0].role == "user" and page.has_more

        with pytest.raises(openai.BadRequestError):
            await client.responses.retrieve(response.id, stream=True)  # not background

        await client.responses.delete(response.id)
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(response.id)
        with pytest.raises(openai.NotFoundError):
            await client.responses.delete(response.id)


async def test_store_false_keeps_nothing(store, tmp_path) -> None:
    provider = DemoModel(delay_seconds=0)
    async with serving(store, tmp_path, provider) as (adapter, _):
        client = client_for(adapter.port)
        response = await client.responses.create(model=provider.name, input="hi", store=False)
        assert response.status == "completed" and response.output_text
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(response.id)


async def test_an_idempotency_key_answers_with_the_first_response(store, tmp_path) -> None:
    provider = DemoModel(delay_seconds=0)
    async with serving(store, tmp_path, provider) as (adapter, _):
        client = client_for(adapter.port)
        headers = {"Idempotency-Key": "k-1"}
        first = await client.responses.create(
            model=provider.name, input="hi", background=True, extra_headers=headers
        )
        again = await client.responses.create(
            model=provider.name, input="hi", background=True, extra_headers=headers
        )
        assert again.id == first.id
        with pytest.raises(openai.UnprocessableEntityError):
            await client.responses.create(
                model=provider.name, input="other", background=True, extra_headers=headers
            )


async def _raw(
    port: int,
    method: str,
    path: str,
    *,
    body: Any = None,
    data: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any]]:
    sent = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    sent.update(headers or {})
    payload = (
        data if data is not None else (json.dumps(body).encode() if body is not None else None)
    )
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, f"http://127.0.0.1:{port}{path}", data=payload, headers=sent) as resp,
    ):
        return resp.status, await resp.json()


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "hi"}, "model"),
        ({"model": "reveille-demo"}, "input"),
        ({"model": "reveille-demo", "input": ""}, "input"),
        ({"model": "reveille-demo", "input": [{"role": "assistant", "content": "x"}]}, "input"),
        ({"model": "reveille-demo", "input": [{"type": "function_call_output"}]}, "input[0]"),
        ({"model": "reveille-demo", "input": [{"role": "root", "content": "x"}]}, "input[0]"),
        ({"model": "reveille-demo", "input": "hi", "background": True, "store": False}, "store"),
        ({"model": "reveille-demo", "input": "hi", "tools": [{"type": "function"}]}, "tools"),
        ({"model": "reveille-demo", "input": "hi", "stream": "yes"}, "stream"),
        ({"model": "reveille-demo", "input": "hi", "temperature": 9}, "temperature"),
        ({"model": "reveille-demo", "input": "hi", "metadata": {"k": 1}}, "metadata"),
        ({"model": "reveille-demo", "input": "hi", "previous_response_id": "x"}, None),
        ({"model": "reveille-demo", "input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ],
)
async def test_bad_input_is_a_clear_400(store, tmp_path, body, param) -> None:
    async with serving(store, tmp_path, DemoModel(delay_seconds=0)) as (adapter, _):
        status, answer = await _raw(adapter.port, "POST", "/v1/responses", body=body)
        assert status == 400, answer
        assert answer["error"]["type"] == "invalid_request_error"
        if param is not None:
            assert answer["error"]["param"] == param


async def test_hostile_requests_and_auth(store, tmp_path) -> None:
    async with serving(store, tmp_path, DemoModel(delay_seconds=0), max_body_bytes=10_000) as (
        adapter,
        service,
    ):
        port = adapter.port
        body = {"model": "reveille-demo", "input": "hi"}
        status, answer = await _raw(
            port, "POST", "/v1/responses", body=body, headers={"Authorization": "Bearer nope"}
        )
        assert status == 401 and answer["error"]["code"] == "invalid_api_key"
        for path in ("/v1/responses/resp_x", "/v1/responses/resp_x/input_items"):
            status, _ = await _raw(port, "GET", path, headers={"Authorization": "Bearer nope"})
            assert status == 401
        status, _ = await _raw(
            port, "POST", "/v1/responses", body=body, headers={"Origin": "https://evil.example"}
        )
        assert status == 403
        status, _ = await _raw(
            port, "POST", "/v1/responses", data=b"{}", headers={"Content-Type": "text/plain"}
        )
        assert status == 415
        status, _ = await _raw(port, "POST", "/v1/responses", data=b"{not json")
        assert status == 400
        status, _ = await _raw(
            port, "POST", "/v1/responses", data=b'{"model": "reveille-demo", "input": "\\ud800"}'
        )
        assert status == 400
        big = {"model": "reveille-demo", "input": "x" * 20_000}
        status, answer = await _raw(port, "POST", "/v1/responses", body=big)
        assert status == 413 and answer["error"]["code"] == "request_too_large"
        status, answer = await _raw(
            port, "POST", "/v1/responses", body={**body, "model": "gpt-nothing"}
        )
        assert status == 404 and answer["error"]["code"] == "model_not_found"
        status, answer = await _raw(
            port, "POST", "/v1/responses", body={**body, "previous_response_id": "resp_missing"}
        )
        assert status == 404 and answer["error"]["param"] == "previous_response_id"
        for path in ("/v1/responses/resp_missing", "/v1/responses/../../etc"):
            status, _ = await _raw(port, "GET", path)
            assert status == 404
        status, made = await _raw(port, "POST", "/v1/responses", body=body)
        assert status == 200
        status, answer = await _raw(
            port, "GET", f"/v1/responses/{made['id']}?stream=true&starting_after=-5"
        )
        assert status == 400 and answer["error"]["param"] == "starting_after"
        status, answer = await _raw(port, "POST", f"/v1/responses/{made['id']}/cancel")
        assert status == 400  # not a background response
        status, answer = await _raw(port, "GET", f"/v1/responses/{made['id']}/input_items?limit=0")
        assert status == 400 and answer["error"]["param"] == "limit"
        assert (await service.get(made["id"])) is not None  # nothing lost by the refusals


async def test_a_sweep_leaves_this_servers_new_responses_alone(store, tmp_path) -> None:
    """Between its insert and the start of its run, a response of this server holds the
    lease the insert gave it: a sweep then (any write pokes one) must not end it."""
    from gateway.openai.responses_wire import parse_responses_body

    provider = DemoModel(delay_seconds=0)
    async with serving(store, tmp_path, provider) as (_, service):
        parsed = parse_responses_body({"model": provider.name, "input": "hi"})
        created = await service.create(parsed, idempotency_key=None, fingerprint=None)
        await service._sweep()
        assert (await service.get(created.row.id)).status == "in_progress"  # type: ignore[union-attr]
        body = await service.run_inline(created.row)
        assert body["status"] == "completed"


async def test_a_failed_terminal_hook_is_offered_again(store, tmp_path, monkeypatch) -> None:
    import gateway.responses

    told: list[tuple[str, str]] = []

    def hook(response_id: str, event_type: str) -> None:
        told.append((response_id, event_type))
        if len(told) == 1:
            raise RuntimeError("the webhook sender is down")

    monkeypatch.setattr(gateway.responses, "_HOOK_RETRY_AFTER_SECONDS", -1.0)
    monkeypatch.setattr(gateway.responses, "_HOOK_CHECK_EVERY_SECONDS", 0.0)
    provider = DemoModel(delay_seconds=0)
    # A foreground response: its hook runs only with ``hook_foreground``.
    foreground = {"hook_foreground": True}
    async with serving(store, tmp_path, provider, hook=hook, service_options=foreground) as (
        adapter,
        service,
    ):
        client = client_for(adapter.port)
        made = await client.responses.create(model=provider.name, input="hi")
        assert told == [(made.id, "response.completed")]
        await service._sweep()
        assert told == [(made.id, "response.completed")] * 2
        await service._sweep()
        assert len(told) == 2  # marked once told


async def test_a_cancelled_responses_hook_offered_again_says_cancelled(
    store, tmp_path, monkeypatch
) -> None:
    """The sweep re-offers an interrupted hook with the row's own terminal type (a cancelled
    response's webhook is ``response.cancelled``, not ``response.failed``)."""
    import gateway.responses

    told: list[tuple[str, str]] = []

    def hook(response_id: str, event_type: str) -> None:
        told.append((response_id, event_type))
        if len(told) == 1:
            raise RuntimeError("the webhook sender is down")

    monkeypatch.setattr(gateway.responses, "_HOOK_RETRY_AFTER_SECONDS", -1.0)
    monkeypatch.setattr(gateway.responses, "_HOOK_CHECK_EVERY_SECONDS", 0.0)
    provider = DemoModel(delay_seconds=0)
    async with serving(store, tmp_path, provider, hook=hook) as (adapter, service):
        service.pause()  # it stays queued: cancelled before any run
        client = client_for(adapter.port)
        made = await client.responses.create(model=provider.name, input="hi", background=True)
        assert (await client.responses.cancel(made.id)).status == "cancelled"
        await service._sweep()
        assert told == [(made.id, "response.cancelled")] * 2


async def test_a_queued_response_left_by_a_stopped_server_runs_on_the_next(store, tmp_path) -> None:
    provider = DemoModel(delay_seconds=0)
    async with serving(store, tmp_path, provider) as (adapter, service):
        service.pause()  # draining: it claims nothing more
        made = await client_for(adapter.port).responses.create(
            model=provider.name, input="hi", background=True
        )
        assert (await service.get(made.id)).status == "queued"  # type: ignore[union-attr]
    async with serving(store, tmp_path, provider) as (adapter, _):
        client = client_for(adapter.port)
        done = await poll(lambda: _status(client, made.id, "completed"))
        assert done.output_text


async def test_more_background_responses_than_room_wait_their_turn(store, tmp_path) -> None:
    provider = DemoModel(delay_seconds=0.05)
    async with serving(store, tmp_path, provider, max_concurrent_runs=2) as (adapter, _):
        client = client_for(adapter.port)
        made = [
            await client.responses.create(model=provider.name, input=f"hi {i}", background=True)
            for i in range(6)
        ]
        assert {m.status for m in made} == {"queued"}

        async def all_done() -> bool:
            found = [await client.responses.retrieve(m.id) for m in made]
            assert not [f for f in found if f.status == "failed"], found
            return all(f.status == "completed" for f in found)

        await poll(all_done, timeout=30)


async def test_a_lone_surrogate_from_the_model_is_repaired_in_the_stream_and_the_store(
    store, tmp_path, fake
) -> None:
    async def broken(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(_sse(_chunk({"role": "assistant", "content": "broken \ud800 piece"})))
        await response.write(_sse(_chunk({}, finish_reason="stop")))
        await response.write(b"data: [DONE]\n\n")
        return response

    fake.script = [broken, broken]
    async with serving(store, tmp_path, upstream(fake)) as (adapter, _):
        client = client_for(adapter.port)
        events = [e async for e in await client.responses.create(
            model="fake-model", input="hi", stream=True
        )]  # fmt: skip
        assert events[-1].type == "response.completed"
        assert events[-1].response.output_text == "broken \ufffd piece"
        created = await client.responses.create(model="fake-model", input="hi", background=True)

        async def ended() -> Any:
            found = await client.responses.retrieve(created.id)
            return found if found.status not in ("queued", "in_progress") else None

        done = await poll(ended)
        assert done.status == "completed" and done.output_text == "broken \ufffd piece"


@pytest.mark.parametrize(
    "after", [str(2**63), str(2**64 + 5), "9" * 40, "-1", "-5", "1.5", "1e3", "1_000", " 3", "x"]
)
async def test_starting_after_beyond_its_range_is_a_400(store, tmp_path, after) -> None:
    """A sequence number no store can hold, a negative or non-integer one: a 400 in the
    OpenAI error shape, before any stream opens (it once was a 200 whose stream carried an
    "internal server error" event and an OverflowError traceback)."""
    async with serving(store, tmp_path, DemoModel(delay_seconds=0)) as (adapter, _):
        body = {"model": "reveille-demo", "input": "hi", "background": True}
        status, made = await _raw(adapter.port, "POST", "/v1/responses", body=body)
        assert status == 200
        query = urllib.parse.quote(after, safe="")
        status, answer = await _raw(
            adapter.port, "GET", f"/v1/responses/{made['id']}?stream=true&starting_after={query}"
        )
        assert status == 400, answer
        assert answer["error"]["type"] == "invalid_request_error"
        assert answer["error"]["param"] == "starting_after"
