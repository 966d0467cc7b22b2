"""What JSON allows but Python chokes on, and failures after a stream began: always a clear
4xx before anything runs, or an error inside the SSE protocol; never a 500, never an HTTP
response written into an open stream body."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import aiohttp
import pytest

from gateway.session import SessionStore
from gateway.surfaces.api_server.adapter import ApiServerAdapter
from tests.api_server._support import KEY, running_adapter

AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}


async def _post(port: int, raw: bytes, path: str = "/v1/chat/completions"):
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"http://127.0.0.1:{port}{path}", data=raw, headers=AUTH) as resp,
    ):
        return resp.status, resp.headers.get("Content-Type", ""), await resp.read()


@pytest.mark.parametrize("stream", ["false", "true"])
async def test_a_lone_surrogate_is_a_400_before_anything_runs(store, stream) -> None:
    async with running_adapter(store) as (adapter, _provider, runner):
        raw = (
            b'{"model":"reveille-demo","stream":' + stream.encode() + b',"messages":'
            b'[{"role":"user","content":"hi \\ud800 there"}]}'
        )
        status, ctype, body = await _post(adapter.port, raw)
        assert status == 400 and ctype.startswith("application/json")
        assert b"surrogate" in body
        assert runner.calls == 0 and store.list_sessions() == []


async def test_a_surrogate_pair_is_text_and_is_accepted(store) -> None:
    async with running_adapter(store) as (adapter, _provider, runner):
        raw = (
            b'{"model":"reveille-demo",'
            b'"messages":[{"role":"user","content":"smile \\ud83d\\ude00"}]}'
        )
        status, _, _ = await _post(adapter.port, raw)
        assert status == 200 and runner.calls == 1


async def test_deep_nesting_is_a_400(store) -> None:
    async with running_adapter(store) as (adapter, _provider, runner):
        raw = b'{"model":"reveille-demo","messages":' + b"[" * 200_000 + b"]" * 200_000 + b"}"
        status, _, body = await _post(adapter.port, raw)
        assert status == 400 and b"nested too deeply" in body
        assert runner.calls == 0


@pytest.mark.parametrize(
    "content", ["5", '{"text":"x"}', "[1,2]", '[{"type":"text","text":5}]', "true"]
)
async def test_malformed_content_is_a_400(store, content) -> None:
    async with running_adapter(store) as (adapter, _provider, runner):
        raw = (
            b'{"model":"reveille-demo","messages":[{"role":"user","content":'
            + content.encode()
            + b"}]}"
        )
        status, _, body = await _post(adapter.port, raw)
        assert status == 400 and b"content" in body
        assert runner.calls == 0 and store.list_sessions() == []


@pytest.mark.parametrize("value", ["9" * 30, "99999999999999999999", "1e400", "-1", "0x10"])
async def test_huge_or_odd_integers_in_queries_are_a_400(store, value) -> None:
    async with (
        running_adapter(store) as (adapter, _provider, _runner),
        aiohttp.ClientSession() as http,
        http.get(
            f"http://127.0.0.1:{adapter.port}/api/sessions?limit={value}", headers=AUTH
        ) as resp,
    ):
        assert resp.status == 400
        assert (await resp.json())["error"]["param"] == "limit"


async def test_an_over_long_title_is_a_400(store) -> None:
    async with running_adapter(store) as (adapter, _provider, _runner):
        raw = b'{"title":"' + b"t" * 201 + b'"}'
        status, _, _ = await _post(adapter.port, raw, "/api/sessions")
        assert status == 400 and store.list_sessions() == []


async def test_health_without_the_key_says_only_that_it_is_up(store) -> None:
    async with running_adapter(store) as (adapter, _provider, _runner):
        base = f"http://127.0.0.1:{adapter.port}/health"
        async with aiohttp.ClientSession() as http:
            async with http.get(base) as resp:
                assert resp.status == 200 and await resp.json() == {"status": "ok"}
            async with http.get(base, headers=AUTH) as resp:
                assert "model" in await resp.json()


async def test_livez_and_readyz_say_up_and_ready_and_why_not_only_with_the_key(store) -> None:
    async with running_adapter(store) as (adapter, _provider, _runner):
        base = f"http://127.0.0.1:{adapter.port}"
        async with aiohttp.ClientSession() as http:
            async with http.get(base + "/livez") as resp:
                assert resp.status == 200 and await resp.json() == {"status": "ok"}
            async with http.get(base + "/readyz") as resp:
                assert resp.status == 200 and await resp.json() == {"status": "ready"}
            store.close()  # the store is gone: not ready, and only a key holder learns why
            async with http.get(base + "/readyz") as resp:
                assert resp.status == 503 and await resp.json() == {"status": "unavailable"}
                assert resp.headers["Retry-After"] == "1"
            async with http.get(base + "/readyz", headers=AUTH) as resp:
                body = await resp.json()
                assert resp.status == 503 and "storage unavailable" in body["reason"]
            adapter.draining = True
            body = {"model": "reveille-demo", "messages": [{"role": "user", "content": "hi"}]}
            async with http.post(base + "/v1/chat/completions", json=body, headers=AUTH) as resp:
                assert resp.status == 503 and resp.headers["Retry-After"] == "1"
                assert (await resp.json())["error"]["code"] == "draining"
            async with http.get(base + "/readyz", headers=AUTH) as resp:
                assert resp.status == 503 and await resp.json() == {
                    "status": "draining",
                    "reason": "draining",
                }
            async with http.get(base + "/livez") as resp:
                assert resp.status == 200  # alive all the same


async def test_an_oversized_header_is_refused_without_a_traceback(store, caplog) -> None:
    async with running_adapter(store) as (adapter, _provider, _runner):
        caplog.set_level(logging.DEBUG)
        async with (
            aiohttp.ClientSession() as http,
            http.get(
                f"http://127.0.0.1:{adapter.port}/health", headers={"X-Big": "x" * 100_000}
            ) as resp,
        ):
            assert resp.status in (400, 431)
        # The server's own loggers: an earlier test's leftovers, collected now by the garbage
        # collector, may log through asyncio's ("Event loop is closed"); they are not this.
        ours = ("aiohttp", "gateway", "reveille", "api")
        assert not [
            r
            for r in caplog.records
            if r.exc_info and r.levelno >= logging.ERROR and r.name.startswith(ours)
        ]


def _adapter(store: SessionStore, runner) -> ApiServerAdapter:
    return ApiServerAdapter(store=store, turn_runner=runner, port=0, api_key=KEY)


async def _stream(port: int) -> bytes:
    raw = b'{"model":"reveille-demo","stream":true,"messages":[{"role":"user","content":"go"}]}'
    status, ctype, body = await _post(port, raw)
    assert status == 200 and ctype.startswith("text/event-stream")
    return body


async def test_a_provider_surrogate_mid_stream_stays_inside_the_protocol(store) -> None:
    async def runner(messages, ctx, on_delta):
        await on_delta("broken \ud800 piece")
        return SimpleNamespace(content="broken \ud800 piece", usage={})

    adapter = _adapter(store, runner)
    await adapter.start()
    try:
        body = await _stream(adapter.port)
    finally:
        await adapter.stop()
    assert b"HTTP/1.1" not in body
    assert body.rstrip().endswith(b"data: [DONE]")
    (session,) = store.list_sessions()
    reply = store.messages(session.id)[-1].content
    assert reply == "broken \ufffd piece"  # stored, repaired


async def test_a_failure_after_the_stream_began_ends_it_with_an_error_chunk(store) -> None:
    async def runner(messages, ctx, on_delta):
        await on_delta("partial ")
        await asyncio.sleep(0)
        raise RuntimeError("the model fell over")

    adapter = _adapter(store, runner)
    await adapter.start()
    try:
        body = await _stream(adapter.port)
    finally:
        await adapter.stop()
    assert b"HTTP/1.1" not in body
    assert b'"error"' in body and body.rstrip().endswith(b"data: [DONE]")
    assert b"the model fell over" not in body  # internals stay in the log


async def test_tool_steps_stream_as_named_events_that_openai_clients_survive(store) -> None:
    from tests.api_server._support import client_for

    async with running_adapter(store) as (adapter, _provider, _runner):
        raw = (
            b'{"model":"reveille-demo","stream":true,"messages":[{"role":"user",'
            b'"content":"in the background: count the stars"}]}'
        )
        _, _, body = await _post(adapter.port, raw)
        text = body.decode()
        assert text.count("event: reveille.tool\n") == 2
        started = text.index('"phase":"started"')
        finished = text.index('"phase":"finished"')
        assert started < finished < text.rindex('"content"')
        assert '"name":"delegate_task"' in text

        client = client_for(adapter.port)
        stream = await client.chat.completions.create(
            model="reveille-demo",
            messages=[{"role": "user", "content": "in the background: count the moons"}],
            stream=True,
        )
        content = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert "count the moons" in content
