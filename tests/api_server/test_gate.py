"""One gate per surface, the API server's side.

A keyless API server (loopback only) used to list and read every web UI session and
Telegram chat, and any response's conversation. Now, without the key, its sessions API
shows API sessions only, and a response (``/v1/responses/{id}``, its input items, a
``previous_response_id`` continuing it, its session) needs the key that created it (or the
server's own). With ``API_SERVER_KEY`` configured, the key holder sees everything, as before.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from agent.providers.demo import DemoModel
from gateway.config import Platform
from gateway.session import SessionSource, SessionStore
from tests.api_server._support import KEY, running_adapter
from tests.api_server.test_responses import serving
from tests.sessions._support import make_session

TG = "agent:main:telegram:dm:7"


async def call(
    port: int, method: str, path: str, body: Any = None, *, key: str | None = None
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if body is not None:
        headers["Content-Type"] = "application/json"
    async with (
        aiohttp.ClientSession() as http,
        http.request(
            method,
            f"http://127.0.0.1:{port}{path}",
            data=json.dumps(body) if body is not None else None,
            headers=headers,
        ) as resp,
    ):
        return resp.status, await resp.json()


def _other_surfaces(store: SessionStore) -> None:
    make_session(store, "webui-1", source=SessionSource(platform=Platform.WEBUI, chat_id="w"))
    store.append_message("webui-1", "user", "the web UI user's diary")
    make_session(store, TG, source=SessionSource(platform=Platform.TELEGRAM, chat_id="7"))
    store.append_message(TG, "user", "a telegram secret")
    make_session(store, "api-1", title="api")


async def test_a_keyless_api_shows_no_web_ui_or_telegram_session(store) -> None:
    _other_surfaces(store)
    async with running_adapter(store, api_key="") as (adapter, _, _):
        port = adapter.port
        status, listed = await call(port, "GET", "/api/sessions")
        assert status == 200
        assert [s["id"] for s in listed["data"]] == ["api-1"]
        for session_id in ("webui-1", TG):
            for method, path in (
                ("GET", f"/api/sessions/{session_id}"),
                ("GET", f"/api/sessions/{session_id}/messages"),
                ("DELETE", f"/api/sessions/{session_id}"),
            ):
                status, answer = await call(port, method, path)
                assert status == 403, (path, answer)
                assert answer["error"]["code"] == "api_key_required"
                assert "API_SERVER_KEY" in answer["error"]["message"]
                assert "diary" not in str(answer) and "secret" not in str(answer)
            status, answer = await call(port, "POST", "/api/sessions", {"id": session_id})
            assert status == 403 and answer["error"]["code"] in (
                "api_key_required",
                "session_id_reserved",  # a chat platform's id: never the API's to create
            )
        assert store.get_session("webui-1") is not None  # nothing deleted
        # The server's own wake-ups (its internal key) still see every session.
        internal = adapter.auth.internal_key
        status, listed = await call(port, "GET", "/api/sessions", key=internal)
        assert {"webui-1", TG, "api-1"} <= {s["id"] for s in listed["data"]}


async def test_with_the_key_the_api_shows_every_surface(store) -> None:
    _other_surfaces(store)
    async with running_adapter(store) as (adapter, _, _):
        status, listed = await call(adapter.port, "GET", "/api/sessions", key=KEY)
        assert {"webui-1", TG, "api-1"} <= {s["id"] for s in listed["data"]}
        status, answer = await call(adapter.port, "GET", "/api/sessions/webui-1/messages", key=KEY)
        assert status == 200 and "diary" in str(answer)


async def test_a_response_needs_the_key_that_created_it(store, tmp_path) -> None:
    async with serving(store, tmp_path, DemoModel(delay_seconds=0), api_key="") as (
        adapter,
        service,
    ):
        port = adapter.port
        body = {"model": "reveille-demo", "input": "alice's secret question"}
        status, made = await call(port, "POST", "/v1/responses", body, key="alice-key")
        assert status == 200, made
        rid = made["id"]
        for path in (f"/v1/responses/{rid}", f"/v1/responses/{rid}/input_items"):
            for other in (None, "mallory-key"):
                status, answer = await call(port, "GET", path, key=other)
                assert status == 404, (path, other, answer)
                assert "secret" not in str(answer)
            assert (await call(port, "GET", path, key="alice-key"))[0] == 200
            assert (await call(port, "GET", path, key=adapter.auth.internal_key))[0] == 200
        follow = {**body, "input": "and then?", "previous_response_id": rid}
        status, answer = await call(port, "POST", "/v1/responses", follow, key="mallory-key")
        assert status == 404 and answer["error"]["param"] == "previous_response_id"
        status, answer = await call(port, "DELETE", f"/v1/responses/{rid}", key="mallory-key")
        assert status == 404
        status, answer = await call(port, "POST", "/v1/responses", follow, key="alice-key")
        assert status == 200, answer
        # Its conversation is not in the sessions API for anyone else either.
        session_id = (await service.get(rid)).session_id
        status, listed = await call(port, "GET", "/api/sessions", key="mallory-key")
        assert session_id not in {s["id"] for s in listed["data"]}
        status, answer = await call(
            port, "GET", f"/api/sessions/{session_id}/messages", key="mallory-key"
        )
        assert status == 403 and "secret" not in str(answer)
        status, answer = await call(
            port, "GET", f"/api/sessions/{session_id}/messages", key="alice-key"
        )
        assert status == 200 and "secret question" in str(answer)
