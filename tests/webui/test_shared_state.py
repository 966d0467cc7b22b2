"""The web UI's state is shared by every server on one state directory: a tab on one server
sees, live, the turns another server runs; a pending approval on one server keeps turns out
through another, and deciding it there runs the command once. A store that fails while a
turn starts gets a clear error and leaves the session usable once the fault is gone."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from tests.agent.test_openai_compat import FakeOpenAI, _chunk, _completion_body
from tests.pg_support import fresh_url
from tests.webui.conftest import WebClient, settings_for, start_web, stop_web
from tests.webui.test_two_processes import Serve


@asynccontextmanager
async def servers(home: Path, count: int, **env: str) -> AsyncIterator[list[WebClient]]:
    """``count`` `reveille serve` processes on ``home``, a tab on each. With
    ``REVEILLE_DATABASE_URL`` in ``env`` they share that database instead, each with a state
    directory of its own (as servers on several hosts do)."""
    shared = "REVEILLE_DATABASE_URL" not in env
    procs = [Serve(home if shared else home / f"host{i}", **env) for i in range(count)]
    jar = aiohttp.CookieJar(unsafe=True)
    try:
        for proc in procs:
            await asyncio.to_thread(proc.wait_listening)
        async with aiohttp.ClientSession(cookie_jar=jar) as http:
            yield [await WebClient.open(proc.webui_port, http) for proc in procs]
    finally:
        for proc in procs:
            assert await asyncio.to_thread(proc.stop) == 0, "".join(proc.lines)


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
async def test_a_tab_on_one_server_sees_the_turns_of_another(tmp_path: Path, store: str) -> None:
    env = {"REVEILLE_DATABASE_URL": fresh_url()} if store == "postgres" else {}
    async with servers(tmp_path / "home", 2, **env) as (on_a, on_b):
        seen_by_b = await on_b.stream()
        sid = await on_a.new_session("shared")
        r = await on_a.post(f"/api/sessions/{sid}/messages", {"text": "hello from A"})
        assert r.status == 202, await r.text()
        await seen_by_b.wait_for(lambda e: e[1] == "turn.end" and e[2]["session_id"] == sid)
        kinds = [k for _, k, d in seen_by_b.events if d.get("session_id") == sid]
        assert kinds.index("turn.start") < kinds.index("turn.delta") < kinds.index("turn.end")
        ids = [int(i) for i, _, _ in seen_by_b.events]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)
        # Replayable from the other server by Last-Event-ID.
        first = seen_by_b.events[0][0]
        replay = await on_a.http.get(on_a.base + "/api/events", headers={"Last-Event-ID": first})
        assert replay.status == 200
        replay.close()
        await seen_by_b.close()


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
async def test_a_pending_approval_on_one_server_keeps_turns_out_through_another(
    tmp_path: Path, store: str
) -> None:
    marker = tmp_path / "ran.txt"
    env = {"REVEILLE_SHELL_ENABLED": "1", "REVEILLE_SHELL_WORKDIR": str(tmp_path)}
    if store == "postgres":
        env["REVEILLE_DATABASE_URL"] = fresh_url()
    async with servers(tmp_path / "home", 2, **env) as (on_a, on_b):
        seen_by_b = await on_b.stream()
        sid = await on_a.new_session("shared")
        command = f"run in the background: echo once >> {marker}"
        assert (await on_a.post(f"/api/sessions/{sid}/messages", {"text": command})).status == 202
        _, _, asked = await seen_by_b.wait_for(lambda e: e[1] == "approval", timeout=20)
        approval = asked["approval"]
        assert approval["status"] == "pending"

        # B sees the session busy with the approval, and keeps a second turn out.
        view = await on_b.session(sid)
        assert view["session"]["busy"] is True
        assert view["pending_approval"]["id"] == approval["id"]
        refused = await on_b.post(f"/api/sessions/{sid}/messages", {"text": "me too"})
        assert refused.status == 409
        assert (await refused.json())["error"]["code"] == "active_stream"

        decided = await on_b.post(f"/api/approvals/{approval['id']}", {"decision": "approve"})
        assert decided.status == 200, await decided.text()
        again = await on_a.post(f"/api/approvals/{approval['id']}", {"decision": "deny"})
        assert again.status == 409  # decided once, whichever server is asked
        # The command runs once, and its result comes home as a wake-up after the turn.
        _, _, woke = await seen_by_b.wait_for(lambda e: e[1] == "wakeup", timeout=30)
        assert woke["session_id"] == sid
        await seen_by_b.wait_for(
            lambda e: (
                e[1] == "turn.end"
                and any(
                    s["wakeup"] and s["stream_id"] == e[2]["stream_id"]
                    for s in seen_by_b.of("turn.start")
                )
            ),
            timeout=30,
        )
        assert marker.read_text() == "once\n"
        await seen_by_b.close()


async def test_a_locked_store_at_turn_start_is_a_clear_error_and_wedges_nothing(
    tmp_path: Path,
) -> None:
    web = await start_web(settings_for(tmp_path))
    try:
        sid = await web.new_session()
        holder = sqlite3.connect(tmp_path / "home" / "sessions.db", isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")  # another process holds the write lock
        try:
            r = await web.post(f"/api/sessions/{sid}/messages", {"text": "hello"})
            assert r.status == 503, await r.text()
            body = await r.json()
            assert "unavailable" in body["error"]["message"]
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert (await web.session(sid))["session"]["busy"] is False
        sse = await web.stream()
        await web.say(sid, "hello again")
        await sse.wait_for(lambda e: e[1] == "turn.end" and e[2]["session_id"] == sid)
        view = await web.session(sid)
        assert view["session"]["busy"] is False
        assert [i["role"] for i in view["items"]] == ["user", "assistant"]
        await sse.close()
    finally:
        await stop_web(web)


class SlowModel(FakeOpenAI):
    """A model that streams its reply slowly (one word every 0.1 s, for about 6 s)."""

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body.get("stream"):
            return web.json_response(_completion_body("quick", None, "stop"))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(60):
            chunk = _chunk({"content": f"word{i} "})
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await asyncio.sleep(0.1)
        await response.write(f"data: {json.dumps(_chunk({}, finish_reason='stop'))}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response


async def test_stop_through_another_server_stops_the_turn(tmp_path: Path) -> None:
    model = SlowModel()
    await model.start()
    env = {
        "REVEILLE_PROVIDER": "openai",
        "REVEILLE_MODEL": "slow",
        "OPENAI_BASE_URL": model.base_url,
        "OPENAI_API_KEY": "sk-fake",
    }
    try:
        async with servers(tmp_path / "home", 2, **env) as (on_a, on_b):
            seen_by_b = await on_b.stream()
            sid = await on_a.new_session("shared")
            assert (await on_a.post(f"/api/sessions/{sid}/messages", {"text": "go"})).status == 202
            await seen_by_b.wait_for(lambda e: e[1] == "turn.delta", timeout=20)
            r = await on_b.post(f"/api/sessions/{sid}/stop", {})
            assert (await r.json())["stopped"] is True
            _, _, end = await seen_by_b.wait_for(lambda e: e[1] == "turn.end", timeout=5)
            assert end["status"] == "stopped"
            view = await on_b.session(sid)
            assert view["session"]["busy"] is False
            assert view["items"][-1]["stopped"] is True
            assert "word59" not in view["items"][-1]["content"]
            await seen_by_b.close()
    finally:
        await model.stop()


async def test_a_logout_through_one_server_ends_the_login_on_another(tmp_path: Path) -> None:
    env = {"REVEILLE_WEBUI_PASSWORD": "hunter2"}
    async with servers(tmp_path / "home", 2, **env) as (on_a, on_b):
        r = await on_a.post("/api/login", {"password": "hunter2"})
        assert r.status == 200, await r.text()
        on_a.csrf = on_b.csrf = (await r.json())["csrf_token"]
        # The cookie jar holds the login for 127.0.0.1: both servers see it.
        assert (await on_b.http.get(on_b.base + "/api/sessions")).status == 200
        assert (await on_a.post("/api/logout", {})).status == 200
        stolen = r.cookies["reveille_webui"].value
        async with aiohttp.ClientSession(cookies={"reveille_webui": stolen}) as copy:
            for _ in range(100):
                status = (await copy.get(on_b.base + "/api/sessions")).status
                if status == 401:
                    break
                await asyncio.sleep(0.05)
            assert status == 401  # ended on B too, without a restart


async def test_a_wakeup_parked_on_one_server_runs_when_the_turn_on_another_ends(
    tmp_path: Path,
) -> None:
    """B's background work finishes while a turn on A holds the session (it waits for an
    approval): B parks the wake-up, and runs it as soon as A's turn ends, not at the next
    re-offer minutes later."""
    env = {
        "REVEILLE_SHELL_ENABLED": "1",
        "REVEILLE_SHELL_WORKDIR": str(tmp_path),
        "REVEILLE_DEMO_DELAY_SECONDS": "2",
    }
    async with servers(tmp_path / "home", 2, **env) as (on_a, on_b):
        seen = await on_b.stream()
        sid = await on_b.new_session("parked")
        await on_b.say(sid, "in the background: weigh the moon")  # finishes in 2 s, on B
        await seen.wait_for(lambda e: e[1] == "turn.end" and e[2]["session_id"] == sid)
        await on_a.say(sid, "run in the background: echo hi")  # A's turn waits for approval
        _, _, asked = await seen.wait_for(lambda e: e[1] == "approval", timeout=20)
        await asyncio.sleep(3)  # B's work is done by now, and parked behind A's turn
        assert not seen.of("wakeup")
        decided = await on_a.post(
            f"/api/approvals/{asked['approval']['id']}", {"decision": "approve"}
        )
        assert decided.status == 200
        _, _, woke = await seen.wait_for(
            lambda e: e[1] == "wakeup" and "weigh the moon" in e[2]["card"]["goal"], timeout=15
        )
        assert woke["session_id"] == sid
        await seen.close()
