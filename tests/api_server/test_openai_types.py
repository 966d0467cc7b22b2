"""Every Response object and stream event, every chat completion and chunk the API server
sends, checked against the official ``openai`` package's pydantic types.

The API is driven with the official client (non-stream, stream, background, retrieve,
cancel, a length cut, a failure, an idempotent replay; chat with and without a stream)
against a real server on loopback whose model is a fake OpenAI-compatible upstream. Each
object is validated in pydantic's strict mode, and any field the type does not declare
(at any depth) is a reject too, except the fields the Open Responses specification requires
of a Response that this openai version does not declare (the penalties, ``store``). The
test counts what it checked and asserts 0 rejects.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import BaseModel, TypeAdapter, ValidationError

from tests.agent.test_openai_compat import FakeOpenAI, _chunk
from tests.api_server._support import client_for, poll
from tests.api_server.test_responses import serving, upstream

Handler = Callable[[web.Request, dict[str, Any]], Awaitable[web.StreamResponse]]

# Beside the openai types' own fields: what the Open Responses schema requires and this
# openai version's Response does not declare.
OPEN_RESPONSES_EXTRAS = frozenset({"presence_penalty", "frequency_penalty", "store"})
# Every field of a Response this server fills (the openai type declares them).
RESPONSE_FIELDS = frozenset(
    [
        "id",
        "object",
        "created_at",
        "completed_at",
        "status",
        "error",
        "incomplete_details",
        "model",
        "output",
        "usage",
        "temperature",
        "top_p",
        "presence_penalty",
        "frequency_penalty",
        "top_logprobs",
        "reasoning",
        "max_output_tokens",
        "max_tool_calls",
        "parallel_tool_calls",
        "tool_choice",
        "tools",
        "text",
        "truncation",
        "service_tier",
        "safety_identifier",
        "prompt_cache_key",
        "prompt",
        "user",
        "store",
        "background",
        "instructions",
        "previous_response_id",
        "metadata",
        "conversation",
    ]
)
USAGE = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}


def _extras(value: Any, path: str = "") -> list[str]:
    """The paths of fields no type declared, anywhere inside a validated model."""
    found: list[str] = []
    if isinstance(value, BaseModel):
        for key in value.model_extra or {}:
            found.append(f"{path}{key}")
        for name in type(value).model_fields:
            found += _extras(getattr(value, name), f"{path}{name}.")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _extras(item, f"{path}{index}.")
    return found


class Conformance:
    """Validates what the server sent; counts the checks and keeps the rejects."""

    def __init__(self) -> None:
        self.checked: dict[str, int] = {}
        self.rejects: list[str] = []
        self._events = TypeAdapter(ResponseStreamEvent)

    def _check(self, kind: str, raw: Any, validate: Callable[[Any], Any], allowed: set[str]) -> Any:
        data = raw.to_dict() if isinstance(raw, BaseModel) else raw
        self.checked[kind] = self.checked.get(kind, 0) + 1
        try:
            model = validate(data)
        except ValidationError as exc:
            self.rejects.append(f"{kind}: {exc}")
            return None
        extra = [path for path in _extras(model) if path not in allowed]
        if extra:
            self.rejects.append(f"{kind} {data.get('type', '')}: undeclared fields {extra}")
        return model

    def response(self, raw: Any) -> Response:
        data = raw.to_dict() if isinstance(raw, BaseModel) else raw
        missing = [name for name in RESPONSE_FIELDS if name not in data]
        if missing:
            self.rejects.append(f"Response {data.get('id')}: missing {missing}")
        return self._check(
            "Response",
            data,
            lambda d: Response.model_validate(d, strict=True),
            set(OPEN_RESPONSES_EXTRAS),
        )

    def event(self, raw: Any) -> Any:
        data = raw.to_dict() if isinstance(raw, BaseModel) else raw
        if isinstance(data.get("response"), dict):
            self.response(data["response"])
        allowed = {f"response.{name}" for name in OPEN_RESPONSES_EXTRAS}
        return self._check(
            "ResponseStreamEvent",
            data,
            lambda d: self._events.validate_python(d, strict=True),
            allowed,
        )

    def completion(self, raw: Any) -> Any:
        return self._check(
            "ChatCompletion", raw, lambda d: ChatCompletion.model_validate(d, strict=True), set()
        )

    def chunk(self, raw: Any) -> Any:
        return self._check(
            "ChatCompletionChunk",
            raw,
            lambda d: ChatCompletionChunk.model_validate(d, strict=True),
            set(),
        )


def reply(*pieces: str, finish: str = "stop") -> Handler:
    """An upstream answer in ``pieces``, streamed or not as the request asks."""

    async def handle(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        if not body.get("stream"):
            message = {"role": "assistant", "content": "".join(pieces)}
            choice = {"index": 0, "message": message, "finish_reason": finish}
            return web.json_response(
                {
                    "id": "c",
                    "object": "chat.completion",
                    "created": 1,
                    "model": "m",
                    "choices": [choice],
                    "usage": USAGE,
                }
            )
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunks = [_chunk({"role": "assistant", "content": piece}) for piece in pieces]
        chunks += [_chunk({}, finish_reason=finish), _chunk({}, usage=USAGE, choices=False)]
        for payload in chunks:
            await response.write(f"data: {json.dumps(payload)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    return handle


def broken_after(piece: str) -> Handler:
    """Streams ``piece``, then an error naming the upstream's address."""

    async def handle(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(f"data: {json.dumps(_chunk({'content': piece}))}\n\n".encode())
        failure = {"error": {"message": "overloaded at http://10.9.8.7:8000/v1", "code": None}}
        await response.write(f"data: {json.dumps(failure)}\n\n".encode())
        await response.write_eof()
        return response

    return handle


class Held:
    """Streams ``Hello`` and then waits until the test lets it finish (or never)."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(f"data: {json.dumps(_chunk({'content': 'Hello'}))}\n\n".encode())
        self.started.set()
        await self.release.wait()
        with contextlib.suppress(ConnectionError):
            await response.write(b"data: [DONE]\n\n")
        return response


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    server = FakeOpenAI()
    await server.start()
    yield server
    await server.stop()


async def _stream(check: Conformance, stream: Any) -> list[Any]:
    events = [event async for event in stream]
    for event in events:
        check.event(event)
    return events


async def test_every_object_and_event_validates_against_the_openai_types(
    store, tmp_path, fake
) -> None:
    check = Conformance()
    held = Held()
    fake.script = [
        reply("Hello", " world"),  # non-stream
        reply("Count", " 1 2 3"),  # stream
        reply("Back", "ground"),  # background, streamed
        reply("cut sh", finish="length"),  # incomplete, streamed
        broken_after("Hel"),  # failed, streamed
        held,  # cancelled
        reply("idem"),  # replayed with an Idempotency-Key
        reply("chat"),  # chat completion
        reply("chat", " stream"),  # chat stream
    ]
    async with serving(store, tmp_path, upstream(fake), hook=lambda *a: None) as (
        adapter,
        service,
    ):
        client = client_for(adapter.port)
        plain = await client.responses.create(model="fake-model", input="hi")
        check.response(plain)
        assert plain.output_text == "Hello world" and plain.status == "completed"
        check.response(await client.responses.retrieve(plain.id))

        events = await _stream(
            check, await client.responses.create(model="fake-model", input="count", stream=True)
        )
        assert events[-1].type == "response.completed"

        created = await client.responses.create(
            model="fake-model", input="bg", background=True, stream=True
        )
        events = await _stream(check, created)
        assert events[0].type == "response.created" and events[-1].type == "response.completed"
        await _stream(check, await client.responses.retrieve(events[0].response.id, stream=True))

        events = await _stream(
            check, await client.responses.create(model="fake-model", input="long", stream=True)
        )
        assert events[-1].type == "response.incomplete"

        events = await _stream(
            check, await client.responses.create(model="fake-model", input="fail", stream=True)
        )
        assert events[-1].type == "response.failed"
        failed = check.response(events[-1].response)
        assert failed is not None and failed.output[0].status == "incomplete"  # type: ignore[union-attr]

        background = await client.responses.create(
            model="fake-model", input="never ends", background=True
        )
        check.response(background)
        await held.started.wait()
        await poll(lambda: _has_delta(service, background.id))
        cancelled = await client.responses.cancel(background.id)
        check.response(cancelled)
        held.release.set()
        check.response(await client.responses.retrieve(background.id))

        headers = {"Idempotency-Key": "replay-1"}
        first = await client.responses.create(
            model="fake-model", input="once", extra_headers=headers
        )
        check.response(first)
        replayed = await _stream(
            check,
            await client.responses.create(
                model="fake-model", input="once", stream=True, extra_headers=headers
            ),
        )
        assert replayed[-1].response.id == first.id

        check.completion(
            await client.chat.completions.create(
                model="fake-model", messages=[{"role": "user", "content": "chat"}]
            )
        )
        chunks = await client.chat.completions.create(
            model="fake-model",
            messages=[{"role": "user", "content": "chat stream"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        async for chunk in chunks:
            check.chunk(chunk)
    total = sum(check.checked.values())
    print(f"validated {total} objects against the openai types: {check.checked}")
    assert not check.rejects, "\n".join(sorted({r[:400] for r in check.rejects}))
    assert check.checked["Response"] >= 25 and check.checked["ResponseStreamEvent"] >= 40
    assert check.checked["ChatCompletion"] == 1 and check.checked["ChatCompletionChunk"] >= 4


def _has_delta(service: Any, response_id: str) -> bool:
    """The response's stored events hold its first text delta."""
    events = service.store.events_after(response_id, -1, 100)
    return any(event.type == "response.output_text.delta" for event in events)
