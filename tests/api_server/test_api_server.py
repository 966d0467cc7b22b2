"""The API server driven by the official openai client on a real loopback port."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import openai
import pytest
from aiohttp import web

from agent.markers import DELIVERY_MARKER, WAKE_DATA_MARKER
from agent.providers.base import ProviderError
from gateway.surfaces.api_server.adapter import ApiServerAdapter, derive_session_id
from gateway.wake import persist_delegation_delivery
from tests.stores import session_file_store

from ._support import KEY, client_for, poll, running_adapter


def _prose(text: str) -> str:
    """``text`` without the wake texts' machine-readable data lines."""
    return "\n".join(line for line in text.splitlines() if WAKE_DATA_MARKER not in line)


HEADER = "X-Hermes-Session-Id"


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


async def new_session(port: int, key: str = KEY) -> str:
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"http://127.0.0.1:{port}/api/sessions",
            json={"title": "t"},
            headers={"Authorization": f"Bearer {key}"},
        ) as resp,
    ):
        assert resp.status == 201
        body = await resp.json()
        assert resp.headers[HEADER] == body["id"]
        return body["id"]


async def get_json(port: int, path: str, key: str = KEY) -> tuple[int, dict]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"Bearer {key}"}
        ) as resp,
    ):
        return resp.status, await resp.json()


async def test_plain_completion_and_derived_session(store) -> None:
    async with running_adapter(store) as (adapter, _provider, _runner):
        client = client_for(adapter.port)
        raw = await client.chat.completions.with_raw_response.create(
            model="reveille-demo", messages=user("hello there")
        )
        completion = raw.parse()
        assert completion.object == "chat.completion"
        assert completion.choices[0].message.role == "assistant"
        assert "demo model" in completion.choices[0].message.content
        assert completion.choices[0].finish_reason == "stop"
        assert completion.usage.total_tokens > 0
        session_id = raw.headers[HEADER]
        assert session_id == derive_session_id(user("hello there"))
        assert session_id.startswith("api_") and len(session_id) == 28
        # Same conversation, same session: the transcript grows there.
        await client.chat.completions.create(
            model="reveille-demo",
            messages=[
                *user("hello there"),
                {"role": "assistant", "content": completion.choices[0].message.content},
                *user("again"),
            ],
        )
        status, body = await get_json(adapter.port, f"/api/sessions/{session_id}/messages")
        assert status == 200
        assert [m["role"] for m in body["data"]] == ["user", "assistant", "user", "assistant"]
        assert body["data"][2]["content"] == "again"


async def test_streamed_text_equals_non_streamed(store) -> None:
    async with running_adapter(store) as (adapter, _provider, _runner):
        client = client_for(adapter.port)
        plain = await client.chat.completions.create(
            model="reveille-demo", messages=user("stream me")
        )
        stream = await client.chat.completions.create(
            model="reveille-demo",
            messages=user("stream me"),
            stream=True,
            stream_options={"include_usage": True},
        )
        pieces, roles, finishes, usage = [], [], [], None
        async for chunk in stream:
            assert chunk.object == "chat.completion.chunk"
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                if choice.delta.role:
                    roles.append(choice.delta.role)
                if choice.delta.content:
                    pieces.append(choice.delta.content)
                if choice.finish_reason:
                    finishes.append(choice.finish_reason)
        assert "".join(pieces) == plain.choices[0].message.content
        assert len(pieces) > 1  # really streamed, word by word
        assert roles == ["assistant"] and finishes == ["stop"]
        assert usage is not None and usage.total_tokens > 0


async def test_stream_wire_format_has_done_and_keepalives(store) -> None:
    # A slow turn: keep-alive comments flow while it runs.
    async with running_adapter(store, delay=0.35, keepalive_seconds=0.1) as (adapter, _p, _r):
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                f"http://127.0.0.1:{adapter.port}/v1/chat/completions",
                json={"model": "reveille-demo", "messages": user("hi"), "stream": True},
                headers={"Authorization": f"Bearer {KEY}"},
            ) as resp,
        ):
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            assert resp.headers[HEADER].startswith("api_")
            text = (await resp.read()).decode()
        assert ": keep-alive" in text
        assert text.rstrip().endswith("data: [DONE]")
        events = [line[6:] for line in text.splitlines() if line.startswith("data: {")]
        first, last = json.loads(events[0]), json.loads(events[-1])
        assert first["choices"][0]["delta"]["role"] == "assistant"
        assert last["choices"][0]["finish_reason"] == "stop"


async def test_models(store) -> None:
    async with running_adapter(store) as (adapter, _provider, _runner):
        client = client_for(adapter.port)
        models = await client.models.list()
        assert [m.id for m in models.data] == ["reveille-demo"]
        model = await client.models.retrieve("reveille-demo")
        assert model.id == "reveille-demo" and model.object == "model"
        with pytest.raises(openai.NotFoundError):
            await client.models.retrieve("gpt-nothing")
        status, body = await get_json(adapter.port, "/health", key="wrong")
        assert status == 200 and body["status"] == "ok"


async def test_session_continuation_via_header(store) -> None:
    async with running_adapter(store) as (adapter, provider, _runner):
        client = client_for(adapter.port)
        session_id = await new_session(adapter.port)
        headers = {HEADER: session_id}
        raw = await client.chat.completions.with_raw_response.create(
            model="reveille-demo", messages=user("my name is Ada"), extra_headers=headers
        )
        assert raw.headers[HEADER] == session_id
        await client.chat.completions.create(
            model="reveille-demo", messages=user("what is my name?"), extra_headers=headers
        )
        # The second turn ran on the stored transcript plus the new message.
        contents = [m["content"] for m in provider.contexts[-1]]
        assert contents[0] == "my name is Ada" and contents[-1] == "what is my name?"
        status, body = await get_json(adapter.port, f"/api/sessions/{session_id}/messages")
        assert [m["content"] for m in body["data"] if m["role"] == "user"] == [
            "my name is Ada",
            "what is my name?",
        ]
        status, listed = await get_json(adapter.port, "/api/sessions")
        assert session_id in [s["id"] for s in listed["data"]]
        status, one = await get_json(adapter.port, f"/api/sessions/{session_id}")
        assert status == 200 and one["session_key"].startswith("agent:main:api_server:")
        async with (
            aiohttp.ClientSession() as http,
            http.delete(
                f"http://127.0.0.1:{adapter.port}/api/sessions/{session_id}",
                headers={"Authorization": f"Bearer {KEY}"},
            ) as resp,
        ):
            assert resp.status == 200 and (await resp.json())["deleted"] is True
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(
                model="reveille-demo", messages=user("x"), extra_headers=headers
            )


async def test_error_statuses_map_to_openai_exceptions(store) -> None:
    async with running_adapter(store, max_body_bytes=4096) as (adapter, _provider, _runner):
        port = adapter.port
        with pytest.raises(openai.AuthenticationError) as auth:
            await client_for(port, key="wrong").chat.completions.create(
                model="reveille-demo", messages=user("x")
            )
        assert auth.value.code == "invalid_api_key"
        client = client_for(port)
        with pytest.raises(openai.BadRequestError) as bad:
            await client.chat.completions.create(
                model="reveille-demo", messages=user("x"), extra_headers={HEADER: "bad id!"}
            )
        assert bad.value.code == "invalid_session_id"
        with pytest.raises(openai.NotFoundError) as missing:
            await client.chat.completions.create(
                model="reveille-demo", messages=user("x"), extra_headers={HEADER: "sess_unknown"}
            )
        assert missing.value.code == "session_not_found"
        with pytest.raises(openai.APIStatusError) as large:
            await client.chat.completions.create(model="reveille-demo", messages=user("y" * 10_000))
        assert large.value.status_code == 413
        assert large.value.body["code"] == "request_too_large"
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(model="", messages=user("x"))
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(model="reveille-demo", messages=[])

    # No key configured: continuing a session is forbidden.
    async with running_adapter(store, api_key="") as (adapter, _provider, _runner):
        client = client_for(adapter.port, key=None)
        ok = await client.chat.completions.create(model="reveille-demo", messages=user("x"))
        assert ok.choices[0].message.content
        with pytest.raises(openai.PermissionDeniedError):
            await client.chat.completions.create(
                model="reveille-demo", messages=user("x"), extra_headers={HEADER: "sess_abc"}
            )


async def test_malformed_bodies_use_the_openai_error_shape(store) -> None:
    async with running_adapter(store) as (adapter, _provider, _runner):
        url = f"http://127.0.0.1:{adapter.port}/v1/chat/completions"
        auth = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
        cases = [
            b"{not json",
            b"[1, 2]",
            json.dumps({"messages": user("x")}).encode(),
            json.dumps({"model": "reveille-demo"}).encode(),
            json.dumps({"model": "reveille-demo", "messages": [{"content": "no role"}]}).encode(),
            json.dumps({"model": "reveille-demo", "messages": user("x"), "stream": "yes"}).encode(),
        ]
        async with aiohttp.ClientSession() as http:
            for body in cases:
                async with http.post(url, data=body, headers=auth) as resp:
                    assert resp.status == 400, body
                    error = (await resp.json())["error"]
                    assert set(error) == {"message", "type", "param", "code"}
                    assert error["type"] == "invalid_request_error"
            async with http.get(f"http://127.0.0.1:{adapter.port}/nope", headers=auth) as resp:
                assert resp.status == 404
                assert set((await resp.json())["error"]) == {"message", "type", "param", "code"}
            async with http.post(url, data=b"{}") as resp:
                assert resp.status == 401
                assert (await resp.json())["error"]["code"] == "invalid_api_key"


async def test_rate_limit_429_with_retry_after(store) -> None:
    async with running_adapter(store, max_concurrent_runs=1, delay=0.3) as (adapter, _p, _r):
        client = client_for(adapter.port)
        first = asyncio.create_task(
            client.chat.completions.create(model="reveille-demo", messages=user("a"))
        )
        await asyncio.sleep(0.1)
        with pytest.raises(openai.RateLimitError) as limited:
            await client.chat.completions.create(model="reveille-demo", messages=user("b"))
        assert limited.value.response.headers["Retry-After"] == "1"
        assert (await first).choices[0].message.content


async def test_fifty_clients_never_exceed_the_cap(store) -> None:
    async with running_adapter(store, max_concurrent_runs=10, delay=0.2) as (adapter, _p, runner):
        client = client_for(adapter.port)

        async def one(i: int) -> str:
            try:
                await client.chat.completions.create(
                    model="reveille-demo", messages=user(f"client {i}")
                )
            except openai.RateLimitError:
                return "429"
            return "ok"

        outcomes = await asyncio.gather(*(one(i) for i in range(50)))
        assert outcomes.count("429") > 0
        assert outcomes.count("ok") >= 10
        assert runner.max_running <= 10
        assert runner.calls == outcomes.count("ok")
        assert adapter.active_runs == 0


async def test_repeated_idempotency_key_runs_one_turn(store) -> None:
    async with running_adapter(store, delay=0.2) as (adapter, _provider, runner):
        client = client_for(adapter.port)
        headers = {"Idempotency-Key": "idem-1"}

        async def call() -> str:
            out = await client.chat.completions.create(
                model="reveille-demo", messages=user("only once"), extra_headers=headers
            )
            return out.id

        ids = await asyncio.gather(call(), call(), call())  # concurrent repeats wait
        ids.append(await call())  # a later repeat replays
        stream = await client.chat.completions.create(
            model="reveille-demo", messages=user("only once"), extra_headers=headers, stream=True
        )
        streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert len(set(ids)) == 1
        assert runner.calls == 1
        session_id = derive_session_id(user("only once"))
        _, body = await get_json(adapter.port, f"/api/sessions/{session_id}/messages")
        assert [m["role"] for m in body["data"]] == ["user", "assistant"]
        assert streamed == body["data"][1]["content"]
        # A different key is a different request.
        await client.chat.completions.create(
            model="reveille-demo",
            messages=user("only once"),
            extra_headers={"Idempotency-Key": "idem-2"},
        )
        assert runner.calls == 2


async def test_idempotency_survives_a_new_server_on_the_same_store(store) -> None:
    async with running_adapter(store) as (adapter, _provider, runner):
        first = await client_for(adapter.port).chat.completions.create(
            model="reveille-demo", messages=user("hi"), extra_headers={"Idempotency-Key": "k"}
        )
    # A claim left "running" by a dead incarnation is taken over, a done one replayed.
    store.claim_idempotent("stale", "999999999:deadbeef:1", session_id=None)
    async with running_adapter(store) as (adapter, _provider, runner):
        client = client_for(adapter.port)
        again = await client.chat.completions.create(
            model="reveille-demo", messages=user("hi"), extra_headers={"Idempotency-Key": "k"}
        )
        assert again.id == first.id and runner.calls == 0
        await client.chat.completions.create(
            model="reveille-demo", messages=user("hi"), extra_headers={"Idempotency-Key": "stale"}
        )
        assert runner.calls == 1


async def test_delivery_rows_are_folded_once(store) -> None:
    async with running_adapter(store) as (adapter, provider, _runner):
        client = client_for(adapter.port)
        session_id = await new_session(adapter.port)
        evt = {
            "type": "async_delegation",
            "delegation_id": "deleg_feed",
            "goal": "count the sheep",
            "status": "completed",
            "summary": "There are 42 sheep.",
        }
        await asyncio.to_thread(persist_delegation_delivery, store, session_id, evt)
        await asyncio.to_thread(persist_delegation_delivery, store, session_id, evt)  # dedupe
        headers = {HEADER: session_id}
        reply = await client.chat.completions.create(
            model="reveille-demo", messages=user("anything new?"), extra_headers=headers
        )
        assert "42 sheep" in reply.choices[0].message.content
        joined = "\n".join(m["content"] or "" for m in provider.contexts[-1])
        # once in the prose (the wake text's data line repeats a preview of it)
        assert _prose(joined).count("There are 42 sheep.") == 1
        assert joined.count(DELIVERY_MARKER) == 1 and joined.count(WAKE_DATA_MARKER) == 1
        await client.chat.completions.create(
            model="reveille-demo", messages=user("ok"), extra_headers=headers
        )
        system = "\n".join(m["content"] for m in provider.contexts[-1] if m["role"] == "system")
        assert _prose(system).count("There are 42 sheep.") == 1  # kept in history, not folded again
        assert (await store.abegin_turn(session_id)).taken == ()


async def test_provider_error_is_502(store) -> None:
    async def failing(messages, ctx, on_delta):
        raise ProviderError("upstream said no", status_code=500)

    adapter = ApiServerAdapter(
        store=store, turn_runner=failing, host="127.0.0.1", port=0, api_key=KEY
    )
    await adapter.start()
    try:
        with pytest.raises(openai.APIStatusError) as err:
            await client_for(adapter.port).chat.completions.create(
                model="reveille-demo", messages=user("x"), extra_headers={"Idempotency-Key": "p"}
            )
        assert err.value.status_code == 502
        assert err.value.body["type"] == "api_error"
        # The failed request did not burn its idempotency key: a retry runs the turn
        # again (and fails again), instead of waiting for or replaying the first.
        with pytest.raises(openai.APIStatusError) as again:
            await client_for(adapter.port).chat.completions.create(
                model="reveille-demo", messages=user("x"), extra_headers={"Idempotency-Key": "p"}
            )
        assert again.value.status_code == 502
        assert adapter.active_runs == 0
    finally:
        await adapter.stop()


async def test_an_unavailable_store_is_a_retryable_503(tmp_path) -> None:
    store = session_file_store(tmp_path / "sessions.db")
    async with running_adapter(store) as (adapter, _provider, runner):
        store.close()  # the store is gone (closed, locked past its timeout, removed)
        client = client_for(adapter.port).with_options(max_retries=0)
        with pytest.raises(openai.InternalServerError) as err:
            await client.chat.completions.create(model="reveille-demo", messages=user("hello"))
        assert err.value.status_code == 503
        assert err.value.response.headers["Retry-After"]
        assert "nothing was changed" in err.value.body["message"]
        assert runner.calls == 0 and adapter.active_runs == 0


async def test_refuses_public_bind_without_key(store) -> None:
    adapter = ApiServerAdapter(
        store=store, turn_runner=lambda *a: None, host="0.0.0.0", port=0, api_key=""
    )
    with pytest.raises(RuntimeError, match="API_SERVER_KEY"):
        await adapter.start()


async def test_delivery_arriving_during_a_turn_is_told_by_the_next_turn(store) -> None:
    async with running_adapter(store) as (adapter, provider, runner):
        client = client_for(adapter.port)
        session_id = await new_session(adapter.port)
        inner = runner.inner
        evt = {
            "type": "async_delegation",
            "delegation_id": "deleg_mid",
            "goal": "paint the fence",
            "status": "completed",
            "summary": "The fence is green.",
        }

        async def arriving_mid_turn(messages, ctx, on_delta):
            await asyncio.to_thread(persist_delegation_delivery, store, session_id, evt)
            return await inner(messages, ctx, on_delta)

        runner.inner = arriving_mid_turn
        headers = {HEADER: session_id}
        first = await client.chat.completions.create(
            model="reveille-demo", messages=user("hello"), extra_headers=headers
        )
        assert "fence" not in first.choices[0].message.content  # arrived after the take
        runner.inner = inner
        second = await client.chat.completions.create(
            model="reveille-demo", messages=user("and now?"), extra_headers=headers
        )
        context = provider.contexts[-1]
        assert DELIVERY_MARKER in context[-2]["content"] and context[-1]["content"] == "and now?"
        assert "The fence is green." in second.choices[0].message.content


async def test_turn_survives_a_client_that_hangs_up(store) -> None:
    async with running_adapter(store, delay=0.3) as (adapter, _provider, runner):
        url = f"http://127.0.0.1:{adapter.port}/v1/chat/completions"
        body = {"model": "reveille-demo", "messages": user("finish without me"), "stream": True}
        async with aiohttp.ClientSession() as http:
            resp = await http.post(url, json=body, headers={"Authorization": f"Bearer {KEY}"})
            assert resp.status == 200
            await resp.content.readline()  # the role chunk, then hang up
            resp.close()
        session_id = derive_session_id(user("finish without me"))

        async def stored() -> bool:
            _, data = await get_json(adapter.port, f"/api/sessions/{session_id}/messages")
            return [m["role"] for m in data["data"]] == ["user", "assistant"]

        await poll(stored)
        assert runner.calls == 1 and adapter.active_runs == 0


async def test_the_key_guards_every_route_of_the_port_even_one_added_later(store) -> None:
    # The check is the port's middleware, not a call each handler must remember: a route
    # added after the server was built (as /metrics and plugins add theirs) is guarded too,
    # and its handler never runs for a caller without the key. A route registered as public
    # (a webhook with a secret of its own) is let through.
    calls: list[str] = []

    async def added(request: web.Request) -> web.Response:
        calls.append("added")
        return web.json_response({"ok": True})

    async def webhook(request: web.Request) -> web.Response:
        calls.append("webhook")
        return web.json_response({"ok": True})

    adapter = ApiServerAdapter(
        store=store, turn_runner=lambda *a: None, host="127.0.0.1", port=0, api_key=KEY
    )
    adapter.app.router.add_get("/added", added)
    adapter.add_public_route("/hook", webhook)
    await adapter.start()
    base = f"http://127.0.0.1:{adapter.port}"
    try:
        async with aiohttp.ClientSession() as http:
            for headers in ({}, {"Authorization": "Bearer not-the-key"}):
                async with http.get(f"{base}/added", headers=headers) as resp:
                    assert resp.status == 401
                    assert (await resp.json())["error"]["code"] == "invalid_api_key"
            assert calls == []
            async with http.get(
                f"{base}/added", headers={"Authorization": f"Bearer {KEY}"}
            ) as resp:
                assert resp.status == 200
            async with http.post(f"{base}/hook", json={}) as resp:
                assert resp.status == 200
        assert calls == ["added", "webhook"]
    finally:
        await adapter.stop()


async def test_a_chat_platforms_session_cannot_be_created_through_the_api(store) -> None:
    # A Telegram chat's session id is its routing key. Created first through the API, that
    # chat's session would be an API transcript, and its background results would go there
    # instead of the chat.
    async with running_adapter(store) as (adapter, _provider, _runner):
        url = f"http://127.0.0.1:{adapter.port}/api/sessions"
        headers = {"Authorization": f"Bearer {KEY}"}
        async with aiohttp.ClientSession() as http:
            for sid in ("agent:main:telegram:dm:111111111", "AGENT:main:telegram:dm:1"):
                async with http.post(url, json={"id": sid}, headers=headers) as resp:
                    assert resp.status == 403
                    assert (await resp.json())["error"]["code"] == "session_id_reserved"
            async with http.post(url, json={"id": "my-own"}, headers=headers) as resp:
                assert resp.status == 201
        assert [s.id for s in store.list_sessions()] == ["my-own"]
