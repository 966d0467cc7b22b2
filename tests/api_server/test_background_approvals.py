"""Approvals asked by background work on the API server, with a fake OpenAI-compatible model
on loopback that makes the conversation delegate and its sub-agent call ``terminal``.

The sub-agent's command is asked after its turn ended, as an approval that holds no session:
listed at ``GET /api/approvals`` (and announced by a ``reveille.approval.requested``
webhook), still pending seconds later while other turns of the conversation go on, decided
once at ``POST /api/approvals/{id}``; the approved command's output comes home once, in the
sub-agent's result. Unanswered, it expires: the unit is told "expired" and the conversation
gets one notice.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agent.markers import SUBAGENT_MARKER
from delivery.session_backend import ApprovalRecord
from gateway.approvals import EXPIRED_DISPLAY_KIND
from gateway.config import Platform
from gateway.session import SessionSource
from gateway.wake import DELEGATION_DISPLAY_KIND
from gateway.webhooks import APPROVAL_REQUESTED, delivery_id_for, new_secret
from reveille.app import serve
from reveille.settings import Settings
from tests.agent.test_openai_compat import FakeOpenAI, completion, provider_for
from tests.agent.test_subagent_tools import routed, tool_call, tool_messages
from tests.gateway.webhook_receiver import WebhookReceiver
from tests.sessions._support import make_session
from tools.shell_tool import EXPIRED_ERROR

from ._support import KEY, poll
from .serve_support import Server, call, chat, transcript, wait_until
from .test_approvals import api
from .test_runner import clean_state, finished_process, messages

__all__ = ["clean_state"]  # the fixture, used by name


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    server = FakeOpenAI()
    await server.start()
    yield server
    await server.stop()


def _delegating(fake: FakeOpenAI, command: str, summary: str, *, turns_after: int = 0) -> None:
    """The conversation delegates (then answers, and answers ``turns_after`` more turns);
    the sub-agent runs ``command`` once and then answers ``summary``."""
    main = [
        completion(None, [tool_call("m1", "delegate_task", goal="run it", background=True)]),
        completion("Started in the background."),
        *[completion(f"another answer {n}") for n in range(turns_after)],
    ]
    sub = [
        completion(None, [tool_call("s1", "terminal", command=command)]),
        completion(summary),
    ]
    fake.script = [routed(main, sub)] * (len(main) + len(sub))


def _sub_tool_results(fake: FakeOpenAI) -> list[dict[str, Any]]:
    calls = [r for r in fake.requests if SUBAGENT_MARKER in json.dumps(r["body"])]
    return [json.loads(m["content"]) for r in calls[-1:] for m in tool_messages(r)]


async def test_a_subagents_command_is_asked_after_its_turn_and_approved_through_the_api(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    """A real `reveille serve`: pending 8 s after the turn ended while another turn of the
    session succeeds; approved, the command runs and its output comes home once."""
    _delegating(fake, "echo approved-output", "It printed approved-output.", turns_after=1)
    env = {
        "REVEILLE_PROVIDER": "openai",
        "REVEILLE_MODEL": "fake-model",
        "OPENAI_BASE_URL": fake.base_url,
        "OPENAI_API_KEY": "sk-test",
        "REVEILLE_SHELL_APPROVALS": "always",
    }
    server = await asyncio.to_thread(Server, tmp_path / "home", extra_env=env)
    try:
        session_id, reply = await asyncio.to_thread(
            chat, server.port, "run it for me", model="fake-model"
        )
        assert reply == "Started in the background."
        ended = time.monotonic()

        def listed() -> list[dict[str, Any]]:
            status, _, body = call(server.port, "GET", "/api/approvals")
            assert status == 200
            return body["data"]

        (approval,) = await asyncio.to_thread(wait_until, listed)
        assert approval["command"] == "echo approved-output"
        assert approval["session_id"] == session_id and approval["unit_id"].startswith("deleg_")
        assert approval["expires_at"] >= time.time() + 3000  # the default hour

        # The session is free meanwhile: another turn in it succeeds.
        _, other = await asyncio.to_thread(
            chat, server.port, "anything else?", session_id, model="fake-model"
        )
        assert other == "another answer 0"
        await asyncio.sleep(max(0.0, ended + 8.0 - time.monotonic()))
        assert [a["id"] for a in await asyncio.to_thread(listed)] == [approval["id"]]
        assert [a["status"] for a in await asyncio.to_thread(listed)] == ["pending"]

        status, _, decided = await asyncio.to_thread(
            call, server.port, "POST", f"/api/approvals/{approval['id']}", {"approve": True}
        )
        assert status == 200 and decided["approval"]["status"] == "approved"

        def delivered() -> list[dict[str, Any]]:
            rows = transcript(server.port, session_id)
            return [r for r in rows if r.get("display_kind") == DELEGATION_DISPLAY_KIND]

        (row,) = await asyncio.to_thread(wait_until, delivered, 30)
        assert "It printed approved-output." in row["content"]
        (result,) = _sub_tool_results(fake)
        assert result["output"] == "approved-output\n"
        # Once: nothing else arrives for it.
        await asyncio.sleep(1.0)
        assert len(await asyncio.to_thread(delivered)) == 1
        assert await asyncio.to_thread(listed) == []
        log = "".join(server.lines)
        assert re.search(rf"approval {approval['id']} asked by background unit deleg_", log)
        assert f"approval {approval['id']} approved by the API" in log
        assert await asyncio.to_thread(server.stop) == 0
    finally:
        if server.proc.poll() is None:
            server.proc.kill()


def _settings(home: Path, fake: FakeOpenAI, **extra: Any) -> Settings:
    return Settings(
        home=home,
        port=0,
        webui_port=0,
        api_key=KEY,
        shell_enabled=True,
        shell_workdir=str(home),
        provider="openai",
        model="fake-model",
        openai_base_url=fake.base_url,
        openai_api_key="sk-test",
        **extra,
    )


async def _asked(port: int) -> dict[str, Any]:
    async def listed() -> list[dict[str, Any]]:
        return (await api(port, "GET", "/api/approvals"))[1]["data"]

    (approval,) = await poll(listed)
    return approval


async def _ask_in_session(port: int) -> tuple[str, dict[str, Any]]:
    status, body = await api(
        port,
        "POST",
        "/v1/chat/completions",
        {"model": "fake-model", "messages": [{"role": "user", "content": "go"}]},
    )
    assert status == 200, body
    return body["choices"][0]["message"]["content"], await _asked(port)


async def test_a_denial_a_second_decision_and_forged_or_foreign_ids(
    fake: FakeOpenAI, tmp_path: Path, clean_state: None
) -> None:
    marker = tmp_path / "ran.txt"
    _delegating(fake, f"touch {marker}", "It was denied.", turns_after=1)  # +1: a wake-up
    receiver = WebhookReceiver()
    await receiver.start()
    secret = new_secret()
    settings = _settings(tmp_path, fake, webhook_urls=receiver.url, webhook_secret=secret)
    try:
        async with serve(settings, provider=provider_for(fake)) as app:
            port = app.adapter.port
            _, approval = await _ask_in_session(port)
            path = f"/api/approvals/{approval['id']}"
            # Announced by a webhook naming the approval.
            await receiver.wait_for(1)
            (got,) = receiver.received
            payload = json.loads(got.body)
            assert payload["type"] == APPROVAL_REQUESTED
            assert payload["data"]["id"] == approval["id"]
            assert payload["id"] == delivery_id_for(APPROVAL_REQUESTED, approval["id"])
            # No key: refused, nothing decided.
            assert (await api(port, "POST", path, {"approve": True}, key=None))[0] == 401
            # Forged ids: 404.
            for forged in ("appr_0000000000000000", "x" * 300):
                status, _ = await api(port, "POST", f"/api/approvals/{forged}", {"approve": True})
                assert status == 404, forged
            # Another surface's background approval (a Telegram chat's): not the API's.
            chat_id = "agent:main:telegram:dm:7"
            make_session(
                app.store, chat_id, source=SessionSource(platform=Platform.TELEGRAM, chat_id="7")
            )
            now = time.time()
            foreign = ApprovalRecord(
                "appr_telegram0002",
                chat_id,
                "",
                "rm -rf /",
                "pending",
                now,
                unit_id="deleg_foreign",
                expires_at=now + 60,
            )
            assert app.store.ask_approval(foreign)
            listed = (await api(port, "GET", "/api/approvals"))[1]["data"]
            assert [a["id"] for a in listed] == [approval["id"]]
            status, _ = await api(port, "POST", f"/api/approvals/{foreign.id}", {"approve": True})
            assert status == 404 and app.store.get_approval(foreign.id).status == "pending"

            # A wake-up of the conversation goes through meanwhile: nothing holds the session.
            evt = finished_process(
                app.runtime.ledger, "proc_meanwhile", origin_session_id=approval["session_id"]
            )
            assert await app.runner.handle_event(evt) == "delivered"
            assert app.store.get_approval(approval["id"]).status == "pending"

            status, decided = await api(port, "POST", path, {"approve": False})
            assert status == 200 and decided["approval"]["status"] == "denied"
            status, again = await api(port, "POST", path, {"approve": True})
            assert status == 409 and again["error"]["code"] == "approval_already_decided"

            session_id = decided["approval"]["session_id"]

            async def delivered() -> list[dict[str, Any]]:
                rows = await messages(port, session_id)
                return [r for r in rows if r["display_kind"] == DELEGATION_DISPLAY_KIND]

            (row,) = await poll(delivered)
            assert "It was denied." in row["content"]
            (result,) = _sub_tool_results(fake)
            assert result["denied"] is True and not marker.exists()
    finally:
        await receiver.stop()


async def test_an_unanswered_approval_expires_with_one_notice(
    fake: FakeOpenAI, tmp_path: Path, clean_state: None
) -> None:
    marker = tmp_path / "ran.txt"
    _delegating(fake, f"touch {marker}", "Nobody answered; not run.")
    settings = _settings(tmp_path, fake, shell_approval_timeout=2.0, delegation_stall_seconds=1.0)
    async with serve(settings, provider=provider_for(fake)) as app:
        port = app.adapter.port
        _, approval = await _ask_in_session(port)
        session_id = approval["session_id"]

        async def rows_of(kind: str) -> list[dict[str, Any]]:
            rows = await messages(port, session_id)
            return [r for r in rows if r["display_kind"] == kind]

        (result_row,) = await poll(lambda: rows_of(DELEGATION_DISPLAY_KIND), timeout=30)
        assert "Nobody answered; not run." in result_row["content"]
        assert "stalled" not in result_row["content"]
        (told,) = _sub_tool_results(fake)
        assert told == {"error": EXPIRED_ERROR, "expired": True}
        (notice,) = await rows_of(EXPIRED_DISPLAY_KIND)
        assert approval["id"] in notice["content"] and "nobody answered" in notice["content"]
        status, late = await api(
            port, "POST", f"/api/approvals/{approval['id']}", {"approve": True}
        )
        assert status == 409 and late["error"]["code"] == "approval_expired"
        assert (await api(port, "GET", "/api/approvals"))[1]["data"] == []
        assert len(await rows_of(EXPIRED_DISPLAY_KIND)) == 1
        assert not marker.exists()


async def test_an_approval_whose_units_server_died_expires_when_read(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    """The server running the unit is killed (-9) while it waits: the next server on the
    state directory settles the approval expired when it is read, with one notice, and a
    late decision is told it expired."""
    _delegating(fake, "echo never", "unused")
    env = {
        "REVEILLE_PROVIDER": "openai",
        "REVEILLE_MODEL": "fake-model",
        "OPENAI_BASE_URL": fake.base_url,
        "OPENAI_API_KEY": "sk-test",
        "REVEILLE_SHELL_APPROVALS": "always",
    }
    home = tmp_path / "home"
    first = await asyncio.to_thread(Server, home, extra_env=env)
    try:
        session_id, _ = await asyncio.to_thread(chat, first.port, "go", model="fake-model")

        def listed(port: int) -> list[dict[str, Any]]:
            return call(port, "GET", "/api/approvals")[2]["data"]

        (approval,) = await asyncio.to_thread(wait_until, lambda: listed(first.port))
    finally:
        first.proc.kill()
        first.proc.wait(timeout=30)
    second = await asyncio.to_thread(Server, home, extra_env=env)
    try:
        assert await asyncio.to_thread(listed, second.port) == []
        status, _, late = await asyncio.to_thread(
            call, second.port, "POST", f"/api/approvals/{approval['id']}", {"approve": True}
        )
        assert status == 409 and late["error"]["code"] == "approval_expired"
        rows = await asyncio.to_thread(transcript, second.port, session_id)
        (notice,) = [r for r in rows if r.get("display_kind") == EXPIRED_DISPLAY_KIND]
        assert approval["id"] in notice["content"]
        # The log is written by a thread of its own: the line comes, maybe a moment later.
        await asyncio.to_thread(second.wait_for, re.compile("its unit is gone"))
        assert _sub_tool_results(fake) == []  # the command never ran
    finally:
        await asyncio.to_thread(second.stop)


async def test_cancelling_a_unit_that_waits_for_approval_withdraws_it_through_the_api(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    """``POST /api/background/{id}/cancel`` on a sub-agent whose command waits for a person:
    the approval is withdrawn (no longer listed, never runs), the row ends cancelled and the
    conversation gets the one notice, never a result."""
    _delegating(fake, "echo never-run > ran.txt", "should never be said")
    env = {
        "REVEILLE_PROVIDER": "openai",
        "REVEILLE_MODEL": "fake-model",
        "OPENAI_BASE_URL": fake.base_url,
        "OPENAI_API_KEY": "sk-test",
        "REVEILLE_SHELL_APPROVALS": "always",
    }
    server = await asyncio.to_thread(Server, tmp_path / "home", extra_env=env)
    try:
        session_id, _ = await asyncio.to_thread(
            chat, server.port, "run it for me", model="fake-model"
        )

        def listed() -> list[dict[str, Any]]:
            status, _, body = call(server.port, "GET", "/api/approvals")
            assert status == 200
            return body["data"]

        (approval,) = await asyncio.to_thread(wait_until, listed)
        status, _, cancelled = await asyncio.to_thread(
            call, server.port, "POST", f"/api/background/{approval['unit_id']}/cancel", {}
        )
        assert status == 200, cancelled
        await asyncio.to_thread(wait_until, lambda: not listed())
        status, _, late = await asyncio.to_thread(
            call, server.port, "POST", f"/api/approvals/{approval['id']}", {"approve": True}
        )
        assert status in (404, 409), late  # withdrawn: no late click runs it

        def noticed() -> list[dict[str, Any]]:
            return [m for m in transcript(server.port, session_id) if m["display_kind"]]

        (notice,) = await asyncio.to_thread(wait_until, noticed)
        assert "should never be said" not in notice["content"]
        await asyncio.sleep(2.5)  # a result that slipped through would land meanwhile
        assert len(await asyncio.to_thread(noticed)) == 1
        assert not any((tmp_path / "home").rglob("ran.txt"))
    finally:
        await asyncio.to_thread(server.stop)
