"""Running background work over the API: ``GET /api/background`` shows it with its progress,
``POST /api/background/{id}/cancel`` stops it (its command's process tree is gone, the
session's transcript gets one notice and never the result), and ``responses.cancel`` on a
background Response cancels the sub-agent its turn started. Real servers (``reveille.app
.serve``), the official ``openai`` client, a fake upstream model on loopback."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aiohttp import web

import tools.async_delegation as ad
from agent.providers.demo import DemoModel
from agent.providers.openai_compat import OpenAICompatProvider
from delivery.cancel import BackgroundUnit, active_units
from gateway.responses import BY_RESPONSE
from gateway.surfaces.api_server.background import BY_API
from reveille.app import serve
from reveille.settings import Settings
from tests.agent.test_openai_compat import FakeOpenAI, _chunk, sse
from tests.agent.test_subagent_tools import tool_call
from tests.api_server._support import KEY, client_for, poll
from tests.api_server.test_approvals import api
from tests.api_server.test_responses import fake
from tests.api_server.test_responses_app import _fresh_runtime
from tests.tools.test_background_cancel import alive
from tools.process_registry import process_registry

HEADER = "X-Hermes-Session-Id"
__all__ = ["_fresh_runtime", "fake"]  # fixtures, used by name


async def test_cancel_over_the_api_kills_the_tree_and_tells_the_session_once(
    tmp_path: Path,
) -> None:
    settings = Settings(
        home=tmp_path,
        port=0,
        webui_port=0,
        api_key=KEY,
        demo_delay_seconds=0,
        shell_enabled=True,
        shell_approvals="never",
        shell_workdir=str(tmp_path),
    )
    pids = tmp_path / "pids"
    command = f"echo $$ > {pids}; sleep 300 & echo $! >> {pids}; echo halfway there; wait"
    async with serve(settings, provider=DemoModel(delay_seconds=0)) as app:
        port = app.adapter.port
        client = client_for(port)
        raw = await client.chat.completions.with_raw_response.create(
            model="reveille-demo",
            messages=[{"role": "user", "content": f"run in the background: {command}"}],
        )
        session_id = raw.headers[HEADER]
        await poll(lambda: pids.exists() and len(pids.read_text().split()) == 2, timeout=20)
        tree = [int(p) for p in pids.read_text().split()]

        async def listed() -> dict[str, Any] | None:
            status, body = await api(port, "GET", f"/api/background?session_id={session_id}")
            assert status == 200, body
            units = [u for u in body["data"] if u["last_line"] == "halfway there"]
            return units[0] if units else None

        unit = await poll(listed, timeout=20)
        assert unit["session_id"] == session_id and unit["state"] == "running"
        assert unit["step"] == "running the command" and unit["elapsed_seconds"] >= 0
        unit_id = unit["id"]

        status, body = await api(port, "POST", f"/api/background/{unit_id}/cancel", key=None)
        assert status == 401
        status, body = await api(port, "POST", "/api/background/proc_forged/cancel")
        assert status == 404 and body["error"]["code"] == "background_unit_not_found"
        status, body = await api(port, "POST", "/api/background/" + "x" * 5000 + "/cancel")
        assert status == 404 and len(body["error"]["message"]) < 200  # no echo of it whole
        status, body = await api(port, "POST", f"/api/background/{unit_id}/cancel")
        assert status == 200 and body["status"] == "cancelled", body
        status, again = await api(port, "POST", f"/api/background/{unit_id}/cancel")
        assert status == 200 and again["status"] == "already_finished"
        assert again["state"] == "cancelled"

        for pid in tree:
            await poll(lambda pid=pid: not alive(pid), timeout=20)

        async def notices() -> list[dict[str, Any]]:
            status, body = await api(port, "GET", f"/api/sessions/{session_id}/messages")
            assert status == 200
            return [
                m
                for m in body["data"]
                if m["role"] == "user" and "Stopped by" in str(m.get("content"))
            ]

        told = await poll(notices, timeout=20)
        await poll(lambda: not process_registry.list_running(), timeout=20)
        await asyncio.sleep(0.5)  # a result that was still coming would land now
        assert len(await notices()) == 1 and BY_API in str(told[0]["content"])
        assert "[Background process stopped]" in str(told[0]["content"])
        status, body = await api(port, "GET", f"/api/sessions/{session_id}/messages")
        assert "[Background process finished]" not in str(body["data"])  # only the notice
        row = ad.get_durable_delegation(unit_id)
        assert row is not None and row["state"] == "cancelled"
        status, body = await api(port, "GET", "/api/background")
        assert body["data"] == []

        # A unit of the session that finished on its own: said so, and left as it ended.
        ledger = app.runtime.ledger
        evt = {"type": "async_delegation", "delegation_id": "deleg_done", "status": "completed"}
        ledger.create(
            "deleg_done", kind="delegation", state="running", origin_session_id=session_id
        )
        assert ledger.finish("deleg_done", expected="running", state="completed", event=evt)
        status, body = await api(port, "POST", "/api/background/deleg_done/cancel")
        assert status == 200 and body["status"] == "already_finished", body
        assert body["state"] == "completed"
        row = ledger.get("deleg_done")
        assert row is not None and row.state == "completed" and row.event == evt


async def test_a_unit_of_another_surface_cannot_be_cancelled_over_the_api(
    tmp_path: Path,
) -> None:
    settings = Settings(home=tmp_path, port=0, webui_port=0, api_key=KEY)
    async with serve(settings, provider=DemoModel(delay_seconds=0)) as app:
        ledger = app.runtime.ledger
        ledger.create(
            "deleg_webui",
            kind="delegation",
            state="running",
            origin_session_id="ui_someone",
            origin_ui_session_id="ui_someone",
            goal="theirs",
            request={"type": "async_delegation", "delegation_id": "deleg_webui"},
        )
        status, body = await api(app.adapter.port, "POST", "/api/background/deleg_webui/cancel")
        assert status == 404
        status, body = await api(app.adapter.port, "GET", "/api/background")
        assert status == 200 and body["data"] == []
        row = ledger.get("deleg_webui")
        assert row is not None and row.state == "running"


async def test_cancelling_a_background_response_cancels_the_subagent_it_started(
    tmp_path: Path, fake: FakeOpenAI
) -> None:
    never = asyncio.Event()
    asked = asyncio.Event()

    async def hang(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        asked.set()
        await never.wait()  # the model does not answer while the test runs
        return web.json_response({"error": {"message": "the test is over"}}, status=500)

    delegate = tool_call("c1", "delegate_task", goal="count the stars", background=True)
    delegate_chunk = {"tool_calls": [{"index": 0, **delegate}]}
    # The response's turn streams: its first answer is the delegation, streamed.
    fake.script = [sse(_chunk(delegate_chunk), _chunk({}, finish_reason="tool_calls"))]
    fake.default = hang  # the sub-agent's call and the turn's next one both hang
    provider = OpenAICompatProvider(fake.base_url, "k", "fake-model", 60.0, max_retries=0)
    settings = Settings(home=tmp_path, port=0, webui_port=0, api_key=KEY)
    async with serve(settings, provider=provider) as app:
        client = client_for(app.adapter.port)
        created = await client.responses.create(
            model="fake-model", input="count the stars, in the background", background=True
        )
        ledger = app.runtime.ledger

        def started() -> BackgroundUnit | None:
            units = active_units(ledger.views, 0.0)
            return units[0] if units else None

        unit = await poll(started, timeout=20)
        await poll(lambda: len(fake.requests) >= 3, timeout=20)  # the sub-agent is asking
        row = ledger.get(unit.id)
        assert row is not None and (row.request or {}).get("response_id") == created.id

        cancelled = await client.responses.cancel(created.id)
        assert cancelled.status == "cancelled"
        row = ledger.get(unit.id)
        assert row is not None and row.state == "cancelled"
        assert row.event is not None and row.event["cancelled_by"] == BY_RESPONSE
        # Its model call was aborted: the unit's slot is free, its result never recorded.
        await poll(lambda: app.runtime.running_count() == 0, timeout=20)
        row = ledger.get(unit.id)
        assert row is not None and row.state == "cancelled"
        assert "summary" not in (row.event or {})
        never.set()
