"""A web page the user visits must not be able to drive the agent through the API server.

Each case plays the attacking page: a cross-site request carries an ``Origin`` header and,
to dodge a CORS preflight, a "simple" content type. The server answers 403 or 415, runs no
turn and writes nothing; allowed origins get CORS headers; every answer is hardened.
"""

from __future__ import annotations

import json

import aiohttp
import pytest

from reveille.settings import SettingsError, load_settings
from tests.api_server._support import KEY, running_adapter
from tests.sessions._support import make_session

EVIL = "https://evil.example"
FRIEND = "https://app.example"
TURN = {"model": "reveille-demo", "messages": [{"role": "user", "content": "run rm -rf ~"}]}


@pytest.mark.parametrize("api_key", ["", KEY])
async def test_a_cross_site_simple_request_runs_no_turn(store, api_key) -> None:
    async with running_adapter(store, api_key=api_key) as (adapter, _provider, runner):
        url = f"http://127.0.0.1:{adapter.port}/v1/chat/completions"
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                url,
                data=json.dumps(TURN),
                headers={"Content-Type": "text/plain", "Origin": EVIL},
            ) as resp,
        ):
            assert resp.status == 403
            error = (await resp.json())["error"]
            assert error["code"] == "origin_not_allowed"
            assert "Access-Control-Allow-Origin" not in resp.headers
        assert runner.calls == 0
        assert store.list_sessions() == []


async def test_a_foreign_origin_is_refused_even_with_json_and_the_key(store) -> None:
    async with running_adapter(store) as (adapter, _provider, runner):
        url = f"http://127.0.0.1:{adapter.port}/v1/chat/completions"
        async with aiohttp.ClientSession() as http:
            headers = {"Authorization": f"Bearer {KEY}", "Origin": EVIL}
            async with http.post(url, json=TURN, headers=headers) as resp:
                assert resp.status == 403
            async with http.get(
                f"http://127.0.0.1:{adapter.port}/api/sessions", headers=headers
            ) as resp:
                assert resp.status == 403  # reads leak transcripts: refused too
        assert runner.calls == 0


async def test_a_text_plain_body_without_origin_is_refused(store) -> None:
    async with running_adapter(store) as (adapter, _provider, runner):
        url = f"http://127.0.0.1:{adapter.port}/v1/chat/completions"
        headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "text/plain"}
        async with (
            aiohttp.ClientSession() as http,
            http.post(url, data=json.dumps(TURN), headers=headers) as resp,
        ):
            assert resp.status == 415
            assert (await resp.json())["error"]["code"] == "unsupported_media_type"
        assert runner.calls == 0 and store.list_sessions() == []


async def test_preflights_are_answered_only_for_allowed_origins(store) -> None:
    allowed = frozenset({FRIEND})
    async with running_adapter(store, allowed_origins=allowed) as (adapter, _p, runner):
        url = f"http://127.0.0.1:{adapter.port}/v1/chat/completions"
        preflight = {
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        }
        async with aiohttp.ClientSession() as http:
            async with http.options(url, headers={**preflight, "Origin": EVIL}) as resp:
                assert resp.status == 403
                assert "Access-Control-Allow-Origin" not in resp.headers
            async with http.options(url, headers={**preflight, "Origin": FRIEND}) as resp:
                assert resp.status == 204
                assert resp.headers["Access-Control-Allow-Origin"] == FRIEND
                assert "authorization" in resp.headers["Access-Control-Allow-Headers"].lower()
            headers = {"Authorization": f"Bearer {KEY}", "Origin": FRIEND}
            async with http.post(url, json=TURN, headers=headers) as resp:
                assert resp.status == 200
                assert resp.headers["Access-Control-Allow-Origin"] == FRIEND
                assert "X-Hermes-Session-Id" in resp.headers["Access-Control-Expose-Headers"]
        assert runner.calls == 1


async def test_every_answer_is_hardened_json_and_streams_alike(store) -> None:
    async with running_adapter(store) as (adapter, _provider, _runner):
        base = f"http://127.0.0.1:{adapter.port}"
        auth = {"Authorization": f"Bearer {KEY}"}
        async with aiohttp.ClientSession() as http:
            answers = [
                await http.get(f"{base}/health"),
                await http.get(f"{base}/nope", headers=auth),
                await http.post(f"{base}/v1/chat/completions", json=TURN, headers=auth),
                await http.post(
                    f"{base}/v1/chat/completions", json={**TURN, "stream": True}, headers=auth
                ),
            ]
            for resp in answers:
                await resp.read()
                assert resp.headers["X-Content-Type-Options"] == "nosniff"
                assert resp.headers["X-Frame-Options"] == "DENY"
                assert "default-src 'none'" in resp.headers["Content-Security-Policy"]
                resp.release()


def test_cors_origins_are_validated(tmp_path) -> None:
    env = {
        "REVEILLE_HOME": str(tmp_path),
        "REVEILLE_CORS_ORIGINS": "https://App.example/, http://x:8",
    }
    assert load_settings(env).allowed_origins == {"https://app.example", "http://x:8"}
    with pytest.raises(SettingsError, match="cors_origins"):
        load_settings({**env, "REVEILLE_CORS_ORIGINS": "javascript:alert(1)"})


async def test_a_rebound_host_name_reads_nothing_from_a_keyless_server(store) -> None:
    # DNS rebinding: a page at evil.example rebinds its name to 127.0.0.1 and reads the API
    # "same-origin". Without a key the server binds loopback only and answers loopback names
    # only; with a key, the page could not present it anyway.
    make_session(store, "secret-talk")
    async with running_adapter(store, api_key="") as (adapter, _provider, runner):
        base = f"http://127.0.0.1:{adapter.port}"
        async with aiohttp.ClientSession() as http:
            for path in ("/api/sessions", "/api/sessions/secret-talk/messages", "/health"):
                headers = {"Host": f"evil.example:{adapter.port}"}
                async with http.get(base + path, headers=headers) as resp:
                    assert resp.status == 403
                    body = await resp.json()
                    assert body["error"]["code"] == "host_refused"
                    assert "secret-talk" not in json.dumps(body)
            async with http.post(
                base + "/v1/chat/completions",
                json=TURN,
                headers={"Host": "evil.example"},
            ) as resp:
                assert resp.status == 403
            for name in ("localhost", "127.0.0.1", "[::1]"):
                headers = {"Host": f"{name}:{adapter.port}"}
                async with http.get(base + "/api/sessions", headers=headers) as resp:
                    assert resp.status == 200
        assert runner.calls == 0
    async with running_adapter(store) as (adapter, _provider, _runner):
        headers = {"Host": "api.example", "Authorization": f"Bearer {KEY}"}
        url = f"http://127.0.0.1:{adapter.port}/api/sessions"
        async with aiohttp.ClientSession() as http, http.get(url, headers=headers) as resp:
            assert resp.status == 200  # a key holder may use any name
