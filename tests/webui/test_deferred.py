"""A wake-up for a busy session waits (no attempt spent) and fires once when it is free:
behind a running turn, behind a pending approval, and across a restart."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import tools.async_delegation as ad
from api import config as cfg
from tests.stores import sqlite_ledger
from tests.webui.conftest import SlowDemo, Web, settings_for, start_web, stop_web


async def _until(pred: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met in time")


def _dispatch(sid: str, goal: str = "side job") -> str:
    res = ad.dispatch_async_delegation(
        goal=goal,
        runner=lambda: {"status": "completed", "summary": f"{goal}: done"},
        session_key=f"agent:main:webui:dm:{sid}",
        origin_session_id=sid,
        origin_ui_session_id=sid,
    )
    assert res["status"] == "dispatched", res
    return str(res["delegation_id"])


def _row(delegation_id: str) -> dict[str, Any]:
    row = ad.get_durable_delegation(delegation_id)
    assert row is not None
    return dict(row)


def _parked(sid: str, delegation_id: str) -> bool:
    with cfg.MAPS_LOCK:
        return delegation_id in cfg.DEFERRED_PROCESS_WAKEUPS.get(sid, {})


def _wake_cards(items: list[dict[str, Any]], delegation_id: str) -> int:
    return sum(
        1 for i in items if i["kind"] == "wakeup" and i["card"]["delivery_id"] == delegation_id
    )


async def test_busy_turn_defers_without_spending_attempts(tmp_path) -> None:
    model = SlowDemo(step=0.02)
    model.gate = asyncio.Event()
    web = await start_web(settings_for(tmp_path), provider=model)
    try:
        sse = await web.stream()
        sid = await web.new_session()
        await web.say(sid, "hello, take your time")
        deleg = await asyncio.to_thread(_dispatch, sid)
        await _until(lambda: _parked(sid, deleg))
        row = _row(deleg)
        assert row["delivery_state"] == "pending" and row["delivery_attempts"] == 0
        assert sse.of("wakeup") == []
        model.gate.set()
        await sse.wait_for(lambda e: e[1] == "wakeup")
        await _until(lambda: _row(deleg)["delivery_state"] == "delivered")
        await asyncio.sleep(0.3)
        assert len(sse.of("wakeup")) == 1
        assert _row(deleg)["delivery_attempts"] == 1
        body = await web.session(sid)
        assert _wake_cards(body["items"], deleg) == 1
        # the wake-up came after the user's turn, never inside it
        kinds = [i["kind"] for i in body["items"]]
        assert kinds[:3] == ["message", "message", "wakeup"]
        await sse.close()
    finally:
        await stop_web(web)


async def test_pending_approval_defers_until_the_decision(tmp_path) -> None:
    settings = settings_for(tmp_path, shell_enabled=True, shell_workdir=str(tmp_path))
    web = await start_web(settings)
    try:
        sse = await web.stream()
        sid = await web.new_session()
        await web.say(sid, "run in the background: echo approved-run")
        _, _, approval = await sse.wait_for(lambda e: e[1] == "approval")
        assert approval["approval"]["status"] == "pending"
        assert approval["approval"]["command"] == "echo approved-run"
        body = await web.session(sid)
        assert body["pending_approval"]["id"] == approval["approval"]["id"]
        assert body["session"]["busy"] is True
        deleg = await asyncio.to_thread(_dispatch, sid)
        await _until(lambda: _parked(sid, deleg))
        await asyncio.sleep(0.2)
        assert _row(deleg)["delivery_attempts"] == 0 and sse.of("wakeup") == []
        r = await web.post(f"/api/approvals/{approval['approval']['id']}", {"decision": "approve"})
        assert r.status == 200
        again = await web.post(f"/api/approvals/{approval['approval']['id']}", {"decision": "deny"})
        assert again.status == 409
        unknown = await web.post("/api/approvals/appr_nope", {"decision": "deny"})
        assert unknown.status == 404
        await sse.wait_for(
            lambda e: e[1] == "wakeup" and e[2]["card"]["delivery_id"] == deleg, timeout=15
        )
        await _until(lambda: _row(deleg)["delivery_state"] == "delivered")
        assert _row(deleg)["delivery_attempts"] == 1
        # the decision came first, then the wake-up: never across it
        order = [k for _, k, d in sse.events if k in ("approval", "wakeup")]
        assert order.index("wakeup") > 1
        await sse.close()
    finally:
        await stop_web(web)


async def test_denied_command_does_not_run(tmp_path) -> None:
    settings = settings_for(tmp_path, shell_enabled=True, shell_workdir=str(tmp_path))
    web = await start_web(settings)
    try:
        sse = await web.stream()
        sid = await web.new_session()
        await web.say(sid, f"run in the background: touch {tmp_path}/ran")
        _, _, approval = await sse.wait_for(lambda e: e[1] == "approval")
        await web.post(f"/api/approvals/{approval['approval']['id']}", {"decision": "deny"})
        await sse.wait_for(lambda e: e[1] == "turn.end")
        assert not (tmp_path / "ran").exists()
        await sse.close()
    finally:
        await stop_web(web)


async def test_deferred_wakeup_survives_a_restart(tmp_path) -> None:
    settings = settings_for(tmp_path)
    model = SlowDemo(step=0.01)
    model.gate = asyncio.Event()  # never opened: the turn is busy until the server stops
    web = await start_web(settings, provider=model)
    sid = await web.new_session()
    await web.say(sid, "hold on")
    deleg = await asyncio.to_thread(_dispatch, sid)
    await _until(lambda: _parked(sid, deleg))
    await stop_web(web)
    with cfg.MAPS_LOCK:
        cfg.DEFERRED_PROCESS_WAKEUPS.clear()  # a new process knows nothing of it
    assert _row_after_restart(settings, deleg)["delivery_attempts"] == 0

    web2: Web = await start_web(settings)
    try:
        for _ in range(200):
            if _wake_cards((await web2.session(sid))["items"], deleg):
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        assert _wake_cards((await web2.session(sid))["items"], deleg) == 1
        await _until(lambda: _row(deleg)["delivery_state"] == "delivered")
        assert _row(deleg)["delivery_attempts"] == 1
    finally:
        await stop_web(web2)


def _row_after_restart(settings: Any, delegation_id: str) -> dict[str, Any]:
    from delivery.ledger import Ledger

    ledger = Ledger(sqlite_ledger(settings.home / "ledger.db"))
    try:
        row = ledger.get(delegation_id)
        assert row is not None
        return row.as_dict()
    finally:
        ledger.close()
