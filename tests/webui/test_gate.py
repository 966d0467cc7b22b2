"""One gate per surface: the web UI on loopback without a password is no way past the API key.

With ``API_SERVER_KEY`` set and no web UI password, any local process could list and decide
the API sessions' and Telegram chats' approvals and read every API transcript through the
web UI's port. Now the web UI shows only its own sessions, refuses the others with a clear
403, and its bootstrap carries the banner that says how to see them (a password). With a
password (or without an API key) it shows everything, as before.
"""

from __future__ import annotations

import time
from typing import Any

from delivery.session_backend import ApprovalRecord
from gateway.config import Platform
from gateway.session import SessionSource
from tests.sessions._support import make_session
from tests.webui.conftest import Web, settings_for, start_web, stop_web

TG = "agent:main:telegram:dm:7"


def _other_surfaces(web: Web) -> ApprovalRecord:
    """An API session with a transcript, a Telegram chat with a pending approval."""
    store = web.app.store
    make_session(store, "api-sess", title="api")
    store.append_message("api-sess", "user", "the API client's secret plan")
    make_session(store, TG, source=SessionSource(platform=Platform.TELEGRAM, chat_id="7"))
    store.take_turn(TG, "turn_tg")
    approval = ApprovalRecord(
        "appr_telegram0001", TG, "turn_tg", "rm -rf /", "pending", time.time()
    )
    assert store.ask_approval(approval)
    return approval


async def _json(web: Web, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    r = await (web.get(path) if method == "GET" else web.post(path, body))
    return r.status, await r.json() if r.content_type == "application/json" else None


async def test_with_an_api_key_and_no_password_the_web_ui_shows_only_its_own(web: Web) -> None:
    approval = _other_surfaces(web)
    mine = await web.new_session("mine")
    boot = await (await web.get("/api/bootstrap")).json()
    assert "Set REVEILLE_WEBUI_PASSWORD to see API and Telegram conversations" in boot["notice"]
    sessions = (await (await web.get("/api/sessions")).json())["sessions"]
    assert [s["id"] for s in sessions] == [mine]
    for session_id in ("api-sess", TG):
        for method, path in (
            ("GET", f"/api/sessions/{session_id}"),
            ("GET", f"/api/sessions/{session_id}/items?before=99"),
            ("GET", f"/api/sessions/{session_id}/background"),
            ("POST", f"/api/sessions/{session_id}/read"),
            ("POST", f"/api/sessions/{session_id}/stop"),
            ("GET", f"/api/sessions/{session_id}/export?format=json"),
        ):
            status, answer = await _json(web, method, path, {})
            assert status == 403, (path, answer)
            assert answer["error"]["code"] == "webui_password_required"
            assert "REVEILLE_WEBUI_PASSWORD" in answer["error"]["message"]
            assert "secret plan" not in str(answer)
    # Search over messages finds nothing of another surface's transcript either.
    status, found = await _json(web, "GET", "/api/search?q=secret")
    assert status == 200 and found["results"] == []
    status, answer = await _json(
        web, "POST", f"/api/approvals/{approval.id}", {"decision": "approve"}
    )
    assert status == 403 and answer["error"]["code"] == "webui_password_required"
    assert web.app.store.get_approval(approval.id).status == "pending"  # nothing decided
    assert (await _json(web, "GET", f"/api/sessions/{mine}"))[0] == 200


async def test_the_restricted_deliveries_page_lists_and_acts_on_web_ui_work_only(web: Web) -> None:
    import asyncio

    import tools.async_delegation as ad

    ledger = ad.get_runtime().ledger

    def rows() -> None:
        ledger.create("deleg_api000001", kind="delegation", origin_session_id="api-sess")
        ledger.create("deleg_tg0000001", kind="delegation", session_key=TG)
        ledger.create("deleg_web000001", kind="delegation", origin_ui_session_id="sess_w")

    await asyncio.to_thread(rows)
    answer = await (await web.get("/api/deliveries")).json()
    assert [d["id"] for d in answer["deliveries"]] == ["deleg_web000001"]
    assert "REVEILLE_WEBUI_PASSWORD" in answer["notice"]
    found = (await (await web.get("/api/deliveries?q=deleg_api000001")).json())["deliveries"]
    assert found == []
    for row_id in ("deleg_api000001", "deleg_tg0000001"):
        status, answer = await _json(web, "POST", f"/api/deliveries/{row_id}/drop", {})
        assert status == 403 and answer["error"]["code"] == "webui_password_required"
        assert ledger.get(row_id).delivery_state == "pending"
    assert (await _json(web, "POST", "/api/deliveries/deleg_web000001/drop", {}))[0] == 200


async def test_with_a_password_the_web_ui_shows_every_surface(tmp_path) -> None:
    web = await start_web(settings_for(tmp_path, webui_password="hunter2"))
    try:
        r = await web.post("/api/login", {"password": "hunter2"})
        web.csrf = (await r.json())["csrf_token"]
        _other_surfaces(web)
        boot = await (await web.get("/api/bootstrap")).json()
        assert not boot.get("notice")
        listed = {s["id"] for s in (await (await web.get("/api/sessions")).json())["sessions"]}
        assert {"api-sess", TG} <= listed
        status, answer = await _json(web, "GET", "/api/sessions/api-sess")
        assert status == 200 and "secret plan" in str(answer)
        status, answer = await _json(
            web, "POST", "/api/approvals/appr_telegram0001", {"decision": "deny"}
        )
        assert status == 200 and answer["approval"]["status"] == "denied"
    finally:
        await stop_web(web)


async def test_without_an_api_key_the_loopback_web_ui_is_the_only_gate(tmp_path) -> None:
    web = await start_web(settings_for(tmp_path, api_key=""))
    try:
        _other_surfaces(web)
        assert not (await (await web.get("/api/bootstrap")).json()).get("notice")
        listed = {s["id"] for s in (await (await web.get("/api/sessions")).json())["sessions"]}
        assert {"api-sess", TG} <= listed
        assert (await _json(web, "GET", "/api/sessions/api-sess"))[0] == 200
    finally:
        await stop_web(web)
