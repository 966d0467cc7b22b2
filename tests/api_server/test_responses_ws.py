"""WebSocket mode of the Responses API (``GET /v1/responses`` upgraded), with aiohttp's client.

A real server on loopback; every event the socket carries is validated against the
``openai`` types (stream events, and the WebSocket ``error`` event).
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from openai.types.responses import ResponseStreamEvent
from openai.types.responses.responses_server_event import ResponseWsError
from pydantic import TypeAdapter

from agent.providers.demo import DemoModel
from tests.agent.test_openai_compat import FakeOpenAI
from tests.api_server._support import KEY, RecordingProvider, client_for, poll
from tests.api_server.test_responses import Gate, serving, upstream

STREAM_EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
CAP = 4096  # the server's max_body_bytes in these tests
checked = 0  # frames validated against the openai types


def _valid(frame: dict[str, Any]) -> Any:
    global checked
    checked += 1
    if frame["type"] == "error":
        return ResponseWsError.model_validate(frame)
    return STREAM_EVENT.validate_python(frame)


def _url(port: int) -> str:
    return f"http://127.0.0.1:{port}/v1/responses"


def _auth(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def _until_done(ws: aiohttp.ClientWebSocketResponse) -> list[dict[str, Any]]:
    """The frames of one create, up to its terminal event (or an error)."""
    frames: list[dict[str, Any]] = []
    while True:
        message = await ws.receive(timeout=30)
        assert message.type == aiohttp.WSMsgType.TEXT, message
        frame = json.loads(message.data)
        _valid(frame)
        frames.append(frame)
        if frame["type"] in ("error", "response.completed", "response.failed"):
            return frames


async def test_a_create_streams_the_events_sse_streams(store, tmp_path) -> None:
    provider = RecordingProvider(DemoModel(delay_seconds=0))
    async with serving(store, tmp_path, provider) as (adapter, _):
        client = client_for(adapter.port)
        sse = [
            e
            async for e in await client.responses.create(
                model=provider.name, input="hi", stream=True
            )
        ]
        async with (
            aiohttp.ClientSession() as http,
            http.ws_connect(_url(adapter.port), headers=_auth()) as ws,
        ):
            await ws.send_json({"type": "response.create", "model": provider.name, "input": "hi"})
            frames = await _until_done(ws)
            assert [f["type"] for f in frames] == [e.type for e in sse]
            assert [f["sequence_number"] for f in frames] == list(range(len(frames)))
            first = frames[-1]["response"]
            assert first["status"] == "completed" and first["output"]
            deltas = "".join(
                f["delta"] for f in frames if f["type"] == "response.output_text.delta"
            )
            assert deltas == first["output"][0]["content"][0]["text"]

            # The same socket carries the next create, continuing the first.
            await ws.send_json(
                {
                    "type": "response.create",
                    "model": provider.name,
                    "input": "and then?",
                    "previous_response_id": first["id"],
                }
            )
            second = await _until_done(ws)
            assert second[-1]["response"]["previous_response_id"] == first["id"]
            stored = await client.responses.retrieve(second[-1]["response"]["id"])
            assert stored.status == "completed"

            # Background: queued, then followed from the store to its end.
            await ws.send_json(
                {
                    "type": "response.create",
                    "model": provider.name,
                    "input": "bg",
                    "background": True,
                }
            )
            queued = await _until_done(ws)
            assert [f["type"] for f in queued][:2] == ["response.created", "response.queued"]
            assert queued[-1]["type"] == "response.completed"


async def test_errors_are_events_and_the_socket_stays_open(store, tmp_path) -> None:
    provider = RecordingProvider(DemoModel(delay_seconds=0))
    async with (
        serving(store, tmp_path, provider, max_body_bytes=CAP) as (adapter, _),
        aiohttp.ClientSession() as http,
        http.ws_connect(_url(adapter.port), headers=_auth()) as ws,
    ):
        create = {"type": "response.create", "model": provider.name}
        sent: list[tuple[Any, int, str]] = [
            ("{not json", 400, "invalid_json"),
            (
                '{"type": "response.create", "input": "\\ud800", "model": "m"}',
                400,
                "invalid_json",
            ),
            ("[1, 2]", 400, "invalid_json"),
            (json.dumps({"type": "session.update"}), 400, "unknown_event_type"),
            (json.dumps({**create, "input": "x" * (CAP + 10)}), 413, "request_too_large"),
            (json.dumps({**create, "input": []}), 400, "missing_required_parameter"),
            (
                json.dumps({**create, "conversation": "conv_" + "0" * 32, "input": "x"}),
                404,
                "conversation_not_found",
            ),
            (
                json.dumps(
                    {
                        **create,
                        "previous_response_id": "resp_nope1",
                        "input": "x",
                        "stream_id": "lane-1",
                    }
                ),
                404,
                "previous_response_not_found",
            ),
            (b"\x00binary", 400, "invalid_frame"),
        ]
        for frame, status, code in sent:
            if isinstance(frame, bytes):
                await ws.send_bytes(frame)
            else:
                await ws.send_str(frame)
            [error] = await _until_done(ws)
            assert error["type"] == "error" and error["status"] == status, (frame, error)
            assert error["error"]["code"] == code and error["error"]["message"]
            # The stream_id of a refused create comes back with its error.
            lane = "lane-1" if isinstance(frame, str) and "lane-1" in frame else None
            assert error.get("stream_id") == lane
        await ws.send_json({**create, "input": "still here?"})
        assert (await _until_done(ws))[-1]["type"] == "response.completed"

        # Far beyond the cap: not read at all, the socket is closed (1009).
        await ws.send_str("x" * (CAP * 8 + 1))
        closing = await ws.receive(timeout=30)
        assert closing.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        assert ws.close_code == aiohttp.WSCloseCode.MESSAGE_TOO_BIG


async def test_the_key_is_checked_before_the_upgrade(store, tmp_path) -> None:
    provider = RecordingProvider(DemoModel(delay_seconds=0))
    async with serving(store, tmp_path, provider) as (adapter, _), aiohttp.ClientSession() as http:
        for headers in ({}, _auth("wrong-key")):
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(_url(adapter.port), headers=headers)
            assert refused.value.status == 401
        async with http.get(_url(adapter.port), headers=_auth()) as plain:
            assert plain.status == 400
            assert (await plain.json())["error"]["code"] == "websocket_required"


async def test_a_client_gone_mid_response_loses_nothing_stored(store, tmp_path) -> None:
    gate = Gate()
    fake = FakeOpenAI()
    fake.script = [gate.handler()]
    await fake.start()
    try:
        async with serving(store, tmp_path, upstream(fake)) as (adapter, _):
            async with aiohttp.ClientSession() as http:
                # The server reads the close once this response's stream ends: not waited for.
                ws = await http.ws_connect(
                    _url(adapter.port),
                    headers=_auth(),
                    timeout=aiohttp.ClientWSTimeout(ws_close=0.1),
                )
                await ws.send_json(
                    {"type": "response.create", "model": "fake-model", "input": "hi"}
                )
                created = json.loads((await ws.receive(timeout=30)).data)
                assert created["type"] == "response.created"
                await gate.started.wait()
                await ws.close()  # gone while the model is still writing
            gate.opened.set()
            client = client_for(adapter.port)
            response_id = created["response"]["id"]
            done = await poll(lambda: _status(client, response_id, "completed"), timeout=30)
            assert done.output_text == "Hello world"
    finally:
        await fake.stop()
    print(f"validated {checked} WebSocket frames against the openai types, 0 rejected")


async def _status(client: Any, response_id: str, status: str) -> Any:
    found = await client.responses.retrieve(response_id)
    return found if found.status == status else None


async def test_a_stopping_server_closes_idle_sockets_going_away(store, tmp_path) -> None:
    provider = RecordingProvider(DemoModel(delay_seconds=0))
    async with aiohttp.ClientSession() as http:
        async with serving(store, tmp_path, provider) as (adapter, _):
            ws = await http.ws_connect(_url(adapter.port), headers=_auth())
        # Left the block: the server stopped, without waiting for the client to leave.
        closing = await ws.receive(timeout=30)
        assert closing.type == aiohttp.WSMsgType.CLOSE
        assert closing.data == aiohttp.WSCloseCode.GOING_AWAY
