"""Approvals on the API server: a turn whose command needs one answers at once with a note
naming it, the session stays busy (wake-ups and other turns wait), the decision is taken
once at ``POST /api/approvals/{id}`` (key required), and the turn's real answer lands in the
transcript and in the next client turn, once."""

from __future__ import annotations

import json
import time
from typing import Any

import aiohttp
import pytest

from agent.markers import DELIVERY_MARKER
from agent.providers.demo import DemoModel
from delivery.session_backend import ApprovalRecord
from gateway.config import Platform
from gateway.session import SessionSource
from gateway.turns.gate import APPROVED_TURN_DISPLAY_KIND
from reveille.app import serve
from reveille.settings import Settings
from tests.sessions._support import make_session
from tools.async_delegation import get_durable_delegation

from ._support import DEMO_DELAY, KEY, RecordingProvider, client_for, poll
from .test_runner import clean_state, finished_process, messages, user

__all__ = ["clean_state"]  # the fixture, used by name

HEADER = "X-Hermes-Session-Id"


@pytest.fixture
async def asking(tmp_path, clean_state):
    settings = Settings(
        home=tmp_path,
        port=0,
        webui_port=0,
        api_key=KEY,
        demo_delay_seconds=DEMO_DELAY,
        shell_enabled=True,
        shell_workdir=str(tmp_path),
    )
    provider = RecordingProvider(DemoModel(delay_seconds=DEMO_DELAY))
    async with serve(settings, provider=provider) as app:
        yield app, provider


async def api(
    port: int, method: str, path: str, body: Any = None, *, key: str | None = KEY
) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, f"http://127.0.0.1:{port}{path}", json=body, headers=headers) as resp,
    ):
        return resp.status, await resp.json()


async def ask(port: int, text: str) -> tuple[str, dict[str, Any]]:
    status, body = await api(
        port, "POST", "/v1/chat/completions", {"model": "reveille-demo", "messages": user(text)}
    )
    assert status == 200, body
    return body["choices"][0]["message"]["content"], body


async def test_an_approval_gates_the_turn_and_a_wake_up(asking) -> None:
    app, provider = asking
    port = app.adapter.port
    client = client_for(port)
    raw = await client.chat.completions.with_raw_response.create(
        model="reveille-demo", messages=user("run in the background: echo approved-run")
    )
    session_id = raw.headers[HEADER]
    body = json.loads(raw.http_response.text)
    approval = body["reveille_approval"]
    note = raw.parse().choices[0].message.content
    assert approval["command"] == "echo approved-run" and approval["status"] == "pending"
    assert approval["session_id"] == session_id
    assert "Waiting for approval" in note and approval["id"] in note

    status, listed = await api(port, "GET", "/api/approvals")
    assert status == 200
    assert [(a["id"], a["command"]) for a in listed["data"]] == [
        (approval["id"], "echo approved-run")
    ]

    # A wake-up for the session waits: refused as a wait, its attempt refunded.
    evt = finished_process(app.runtime.ledger, "proc_gated", origin_session_id=session_id)
    assert await app.runner.handle_event(evt) == "released"
    row = get_durable_delegation("proc_gated")
    assert row["delivery_state"] == "pending" and row["delivery_attempts"] == 0
    # ... and so does another client turn in the session.
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"model": "reveille-demo", "messages": user("and now?")},
            headers={"Authorization": f"Bearer {KEY}", HEADER: session_id},
        ) as resp,
    ):
        assert resp.status == 409
        assert (await resp.json())["error"]["code"] == "session_busy"

    status, decided = await api(port, "POST", f"/api/approvals/{approval['id']}", {"approve": True})
    assert status == 200 and decided["approval"]["status"] == "approved"
    status, again = await api(port, "POST", f"/api/approvals/{approval['id']}", {"approve": False})
    assert status == 409 and again["error"]["code"] == "approval_already_decided"

    async def answered() -> list[dict]:
        rows = await messages(port, session_id)
        return [r for r in rows if r["display_kind"] == APPROVED_TURN_DISPLAY_KIND]

    (row,) = await poll(answered)
    assert "Started `echo approved-run` in the background" in row["content"]
    # The session is free: the wake-up that waited is offered again (the ledger's
    # re-offer of a refunded release) and goes through now.
    await poll(
        lambda: get_durable_delegation("proc_gated")["delivery_state"] == "delivered",
        timeout=60,
    )
    assert get_durable_delegation("proc_gated")["delivery_attempts"] == 1

    follow = await client.chat.completions.create(
        model="reveille-demo", messages=user("what happened?"), extra_headers={HEADER: session_id}
    )
    assert follow.choices[0].message.content
    # Folded into the context once (by whichever turn came first: here, the wake-up of the
    # command's own completion), as a delivery; never twice.
    folded = [
        m
        for m in provider.contexts[-1]
        if m["role"] == "system"
        and DELIVERY_MARKER in (m["content"] or "")
        and f"(approval {approval['id']}) was decided" in m["content"]
    ]
    assert len(folded) == 1
    rows = await messages(port, session_id)
    assert [r["folded"] for r in rows if r["display_kind"] == APPROVED_TURN_DISPLAY_KIND] == [True]
    status, listed = await api(port, "GET", "/api/approvals")
    assert listed["data"] == []


async def test_a_denied_command_never_runs_and_a_stream_says_it_waits(asking, tmp_path) -> None:
    app, _ = asking
    port = app.adapter.port
    marker = tmp_path / "ran.txt"
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={
                "model": "reveille-demo",
                "stream": True,
                "messages": user(f"run in the background: touch {marker}"),
            },
            headers={"Authorization": f"Bearer {KEY}"},
        ) as resp,
    ):
        assert resp.status == 200
        session_id = resp.headers[HEADER]
        raw = (await resp.read()).decode()
    events = [line[6:] for line in raw.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert "Waiting for approval" in text
    (approval,) = [c["reveille_approval"] for c in chunks if c.get("reveille_approval")]
    assert "event: reveille.approval" in raw
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"

    status, decided = await api(
        port, "POST", f"/api/approvals/{approval['id']}", {"approve": False}
    )
    assert status == 200 and decided["approval"]["status"] == "denied"

    async def answered() -> list[dict]:
        rows = await messages(port, session_id)
        return [r for r in rows if r["display_kind"] == APPROVED_TURN_DISPLAY_KIND]

    (row,) = await poll(answered)
    assert "denied" in row["content"].lower()
    assert not marker.exists()


async def test_hostile_decisions_are_refused(asking) -> None:
    app, _ = asking
    port = app.adapter.port
    _, body = await ask(port, "run in the background: echo x")
    approval_id = body["reveille_approval"]["id"]
    path = f"/api/approvals/{approval_id}"
    # No key, a wrong key: 401, nothing decided.
    assert (await api(port, "GET", "/api/approvals", key=None))[0] == 401
    assert (await api(port, "POST", path, {"approve": True}, key=None))[0] == 401
    assert (await api(port, "POST", path, {"approve": True}, key="wrong"))[0] == 401
    # A body that is not a decision: 400.
    for bad in ({}, {"approve": "yes"}, {"approve": 1}, [True], {"decision": "approve"}):
        status, error = await api(port, "POST", path, bad)
        assert status == 400 and error["error"]["code"] == "invalid_decision", bad
    # Forged ids: 404.
    for forged in ("appr_0000000000000000", "x" * 300, "..%2F..%2Fapi%2Fsessions"):
        status, error = await api(port, "POST", f"/api/approvals/{forged}", {"approve": True})
        assert status == 404, forged
    # Another surface's approval (a Telegram chat's) is not the API's to list or decide.
    chat = "agent:main:telegram:dm:7"
    make_session(app.store, chat, source=SessionSource(platform=Platform.TELEGRAM, chat_id="7"))
    app.store.take_turn(chat, "turn_tg")
    foreign = ApprovalRecord(
        "appr_telegram0001", chat, "turn_tg", "rm -rf /", "pending", time.time()
    )
    assert app.store.ask_approval(foreign)
    listed = (await api(port, "GET", "/api/approvals"))[1]["data"]
    assert [a["id"] for a in listed] == [approval_id]
    status, _ = await api(port, "POST", f"/api/approvals/{foreign.id}", {"approve": True})
    assert status == 404 and app.store.get_approval(foreign.id).status == "pending"
    app.store.end_turn(chat, "turn_tg")
    assert app.store.get_approval(approval_id).status == "pending"
    status, decided = await api(port, "POST", path, {"approve": False})
    assert status == 200 and decided["approval"]["status"] == "denied"
    status, again = await api(port, "POST", path, {"approve": True})
    assert status == 409 and again["error"]["code"] == "approval_already_decided"
    assert app.store.get_approval(approval_id).status == "denied"
