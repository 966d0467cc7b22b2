"""Bounds of background responses (issue 29, item 6): the queue is capped per key and in
all, with a clear 429; background work runs in a pool of its own, so queued responses with
a slow model never make foreground chat requests (or the server's wake-ups) get a 429.

The model is ``FakeOpenAI``: a background request's answer waits on a gate the test never
opens (a slow model as a state, not a time), a chat request is answered at once.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from delivery.responses_backend import QueueFull
from gateway.openai.responses_wire import ResponsesRequest, parse_responses_body
from tests.agent.test_openai_compat import FakeOpenAI, _chunk, completion, sse
from tests.api_server import test_responses
from tests.api_server._support import KEY, client_for, poll
from tests.api_server.test_responses import Gate, serving, upstream

fake = test_responses.fake  # the fake upstream's fixture, shared

SLOW = "slow background work"


def slow_or_quick(gate: Gate) -> Any:
    """Background requests wait on ``gate``; anything else is answered "quick" at once."""
    slow = gate.handler()

    async def handle(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        if SLOW in json.dumps(body["messages"]):
            return await slow(request, body)
        if body.get("stream"):
            quick = sse(_chunk({"role": "assistant", "content": "quick"}), _chunk({}, "stop"))
            return await quick(request, body)
        return await completion("quick")(request, body)

    return handle


async def _post(
    port: int, path: str, body: dict[str, Any], key: str | None = None
) -> tuple[int, dict[str, Any], Any]:
    headers = {"Authorization": f"Bearer {KEY}"}
    if key is not None:
        headers["Idempotency-Key"] = key
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"http://127.0.0.1:{port}{path}", json=body, headers=headers) as r,
    ):
        return r.status, dict(r.headers), await r.json()


async def test_queued_background_responses_are_capped_per_key_and_in_all(
    store, tmp_path, fake: FakeOpenAI
) -> None:
    gate = Gate()
    fake.default = slow_or_quick(gate)
    options = {"max_queued_per_key": 3, "max_queued": 5}
    async with serving(store, tmp_path, upstream(fake), service_options=options) as (
        adapter,
        service,
    ):
        service.pause()  # nothing is claimed: every create stays queued
        body = {"model": "fake-model", "input": SLOW, "background": True}
        for i in range(3):
            status, _, made = await _post(adapter.port, "/v1/responses", body, key=f"k{i}")
            assert status == 200 and made["status"] == "queued"
        status, headers, refused = await _post(adapter.port, "/v1/responses", body)
        assert status == 429, refused
        assert refused["error"]["type"] == "rate_limit_error"
        assert refused["error"]["code"] == "too_many_queued"
        assert "max_queued_per_key = 3" in refused["error"]["message"]
        assert int(headers["Retry-After"]) > 0
        # A repeat of an accepted create (its Idempotency-Key) is answered, never refused.
        status, headers, again = await _post(adapter.port, "/v1/responses", body, key="k2")
        assert status == 200 and again["id"] == made["id"]
        assert headers["Idempotent-Replayed"] == "true"
        # Another key's requests count in all: two more fit, the sixth does not.
        request = ResponsesRequest.from_json(json.dumps(_checked(body)))
        for _ in range(2):
            await service.create(request, idempotency_key=None, fingerprint=None, caller="other")
        with pytest.raises(QueueFull) as full:
            await service.create(request, idempotency_key=None, fingerprint=None, caller="third")
        assert not full.value.per_key and "max_queued = 5" in str(full.value)
        assert (await asyncio.to_thread(service.store.queued, "other")) == (5, 2)
        # A foreground (non-background) response is not queued: never refused by the cap.
        status, _, answered = await _post(
            adapter.port, "/v1/responses", {"model": "fake-model", "input": "hi"}
        )
        assert status == 200 and answered["status"] == "completed"


def _checked(body: dict[str, Any]) -> dict[str, Any]:
    return json.loads(parse_responses_body(body).to_json())


async def test_sixty_queued_background_responses_never_refuse_foreground_chat(
    store, tmp_path, fake: FakeOpenAI
) -> None:
    gate = Gate()
    fake.default = slow_or_quick(gate)
    async with serving(
        store,
        tmp_path,
        upstream(fake),
        max_concurrent_runs=10,
        service_options={"background_concurrency": 4},
    ) as (adapter, _):
        client = client_for(adapter.port)
        made = [
            await client.responses.create(model="fake-model", input=SLOW, background=True)
            for _ in range(60)
        ]
        # The pool is full (4 running, held by the slow model); the rest stay queued.
        await poll(lambda: adapter.turns.background_runs == 4)
        assert adapter.turns.active_runs == 0  # none of the chat slots taken
        chats = await asyncio.gather(
            *(
                _post(
                    adapter.port,
                    "/v1/chat/completions",
                    {"model": "fake-model", "messages": [{"role": "user", "content": f"hi {i}"}]},
                )
                for i in range(10)
            )
        )
        assert [status for status, _, _ in chats] == [200] * 10, [c[2] for c in chats]
        assert all(c[2]["choices"][0]["message"]["content"] == "quick" for c in chats)
        statuses = [(await client.responses.retrieve(m.id)).status for m in made]
        assert statuses.count("in_progress") == 4 and statuses.count("queued") == 56
        gate.opened.set()  # the slow model answers now: the queue drains through the pool
        await poll(lambda: _all_completed(client, [m.id for m in made]), timeout=60, interval=0.2)


async def _all_completed(client: Any, ids: list[str]) -> bool:
    for response_id in ids:
        if (await client.responses.retrieve(response_id)).status != "completed":
            return False
    return True
