"""The gateway runner end to end: background work comes back to the session that started it."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import openai
import pytest

from agent.markers import DELIVERY_MARKER, WAKE_DATA_MARKER, WAKE_MARKER, read_wake_data
from agent.providers.demo import DemoModel
from delivery.rows import RowQuery
from gateway.wake import DELEGATION_DISPLAY_KIND, WakeDeliveryError
from gateway.wake_text import wake_batch_key
from reveille.app import serve
from reveille.settings import Settings
from tests.sessions._support import make_session
from tools.async_delegation import (
    get_durable_delegation,
    get_runtime,
    reset_runtime,
)
from tools.process_registry import process_registry

from ._support import DEMO_DELAY, KEY, RecordingProvider, client_for, poll

HEADER = "X-Hermes-Session-Id"


@pytest.fixture
def clean_state(tmp_path, monkeypatch):
    monkeypatch.setenv("REVEILLE_HOME", str(tmp_path))
    process_registry.completion_queue.drain()
    yield
    reset_runtime()
    process_registry.completion_queue.drain()


@pytest.fixture
async def gateway(tmp_path, clean_state):
    settings = Settings(
        home=tmp_path,
        port=0,
        webui_port=0,
        api_key=KEY,
        demo_delay_seconds=DEMO_DELAY,
        shell_enabled=True,
        shell_approvals="never",
        shell_workdir=str(tmp_path),
    )
    provider = RecordingProvider(DemoModel(delay_seconds=DEMO_DELAY))
    async with serve(settings, provider=provider) as app:
        yield app, provider


@pytest.fixture
def runtime(gateway):
    """The ledger runtime the server opened (the process's contract runtime)."""
    return gateway[0].runtime


def finished_process(ledger, row_id: str, **event) -> dict:
    """A process completion whose terminal row is in the ledger, ready to be delivered."""
    evt = {"type": "completion", "delivery_id": row_id, "dispatched_at": time.time(), **event}
    ledger.create(row_id, kind="process", state="running", request=evt, goal="x")
    assert ledger.finish(row_id, expected="running", state="completed", event=evt)
    return evt


async def messages(port: int, session_id: str) -> list[dict]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            f"http://127.0.0.1:{port}/api/sessions/{session_id}/messages",
            headers={"Authorization": f"Bearer {KEY}"},
        ) as resp,
    ):
        assert resp.status == 200
        return (await resp.json())["data"]


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


async def test_background_delegation_comes_back_as_a_delivery_row(gateway) -> None:
    app, provider = gateway
    port = app.adapter.port
    client = client_for(port)
    started = time.monotonic()
    raw = await client.chat.completions.with_raw_response.create(
        model="reveille-demo", messages=user("in the background: summarise the Q3 report")
    )
    reply = raw.parse().choices[0].message.content
    session_id = raw.headers[HEADER]
    assert "Started in the background" in reply
    assert time.monotonic() - started < 2  # the turn did not wait for the work

    async def delivered() -> list[dict]:
        rows = await messages(port, session_id)
        return [r for r in rows if r["display_kind"] == DELEGATION_DISPLAY_KIND]

    (row,) = await poll(delivered)
    assert row["role"] == "system" and not row["folded"]
    assert row["display_metadata"]["goal"] == "summarise the Q3 report"
    assert row["display_metadata"]["tasks"] == 1 and row["display_metadata"]["completed"] == 1
    assert row["content"].startswith(WAKE_MARKER)
    deleg_id = row["display_metadata"]["delegation_id"]
    await poll(lambda: get_durable_delegation(deleg_id)["delivery_state"] == "delivered")

    follow = await client.chat.completions.create(
        model="reveille-demo",
        messages=user("any news?"),
        extra_headers={HEADER: session_id},
    )
    context = provider.contexts[-1]
    assert sum(DELIVERY_MARKER in (m["content"] or "") for m in context) == 1
    result = "Done: summarise the Q3 report. (demo sub-agent result)"
    joined = "\n".join(m["content"] or "" for m in context)
    # once in the prose; the wake text's one data line repeats a preview of it
    assert joined.count(WAKE_DATA_MARKER) == 1
    prose = "\n".join(line for line in joined.splitlines() if WAKE_DATA_MARKER not in line)
    assert prose.count(result) == 1
    assert row["display_metadata"]["summary"] == result
    assert "summarise the Q3 report" in follow.choices[0].message.content
    rows = await messages(port, session_id)
    assert [r["folded"] for r in rows if r["display_kind"]] == [True]


async def test_background_process_wakes_its_session_once(gateway) -> None:
    app, _provider = gateway
    port = app.adapter.port
    client = client_for(port)
    raw = await client.chat.completions.with_raw_response.create(
        model="reveille-demo", messages=user("run in the background: echo hi")
    )
    session_id = raw.headers[HEADER]
    assert "Started `echo hi` in the background" in raw.parse().choices[0].message.content

    async def woken() -> list[dict]:
        rows = await messages(port, session_id)
        wakes = [r for r in rows if r["role"] == "user" and r["content"].startswith(WAKE_MARKER)]
        return wakes if wakes and rows[-1]["role"] == "assistant" else []

    (wake,) = await poll(woken)
    assert "echo hi" in wake["content"] and "Exit code: 0" in wake["content"]
    rows = await messages(port, session_id)
    assert "Background work finished" in rows[-1]["content"]
    proc_id = next(r for r in get_runtime().ledger.query(RowQuery(kind="process", limit=5))).id
    await poll(lambda: get_durable_delegation(proc_id)["delivery_state"] == "delivered")
    await asyncio.sleep(0.3)
    rows = await messages(port, session_id)
    assert sum(r["content"].startswith(WAKE_MARKER) for r in rows) == 1
    assert len(rows) == 4  # the command turn and the wake turn


async def test_routing_rules(gateway, runtime) -> None:
    app, _provider = gateway
    store = app.store
    make_session(store, "sess_live")
    ledger = runtime.ledger

    def pending(row_id: str, **event) -> dict:
        return finished_process(ledger, row_id, **event)

    # No origin at all: released (an attempt spent), not delivered anywhere.
    evt = pending("proc_noorigin")
    assert await app.runner.handle_event(evt) == "released"
    row = get_durable_delegation("proc_noorigin")
    assert row["delivery_state"] == "pending" and row["delivery_attempts"] == 1

    # The origin session is gone: dropped.
    evt = pending("proc_gone", origin_session_id="sess_deleted")
    assert await app.runner.handle_event(evt) == "dropped"
    assert get_durable_delegation("proc_gone")["delivery_state"] == "dropped"

    # A session created after the work started (same id reused) does not adopt it.
    evt = pending("proc_adopt", origin_session_id="sess_late", dispatched_at=time.time() - 60)
    make_session(store, "sess_late")
    assert await app.runner.handle_event(evt) == "dropped"

    # Another surface's session: not claimed at all.
    evt = pending("proc_ui", origin_ui_session_id="ui_1")
    assert await app.runner.handle_event(evt) == "foreign"
    assert get_durable_delegation("proc_ui")["delivery_attempts"] == 0


@pytest.mark.parametrize("kind", ["", None, "weather_report", 7])
async def test_an_unknown_event_type_is_refused_at_the_edge(gateway, runtime, kind) -> None:
    """A completion of an unknown or missing type would become a wake-up of generic text:
    its ledger row is dropped with the reason (what `reveille deliveries` shows) and
    nothing reaches the session; without a ledger id it is ignored."""
    app, _provider = gateway
    make_session(app.store, "sess_live")
    evt = finished_process(runtime.ledger, "proc_odd", origin_session_id="sess_live")
    evt["type"] = kind
    assert await app.runner.handle_event(evt) == "ignored"
    row = get_durable_delegation("proc_odd")
    assert row["delivery_state"] == "dropped"
    assert "unknown completion event type" in row["settled_reason"]
    assert app.store.messages("sess_live") == []
    assert await app.runner.handle_event({"type": kind, "summary": "x"}) == "ignored"


async def test_transient_refusal_releases_retryable(gateway, runtime, monkeypatch) -> None:
    app, _provider = gateway
    make_session(app.store, "sess_busy")
    evt = finished_process(runtime.ledger, "proc_busy", origin_session_id="sess_busy")

    async def busy(*args, **kwargs):
        raise WakeDeliveryError("gave up: HTTP 429", transient=True, status=429)

    monkeypatch.setattr("gateway.delivery_targets.deliver_wake", busy)
    assert await app.runner.handle_event(evt) == "released"
    row = get_durable_delegation("proc_busy")
    assert row["delivery_state"] == "pending" and row["delivery_attempts"] == 0


async def test_keyless_server_still_wakes_its_sessions(tmp_path, clean_state) -> None:
    # No API key configured: outside clients cannot continue sessions by header, but the
    # server's own wake self-POST (with its internal key) can.
    settings = Settings(
        home=tmp_path,
        port=0,
        webui_port=0,
        api_key="",
        shell_enabled=True,
        shell_approvals="never",
        shell_workdir=str(tmp_path),
    )
    async with serve(settings, provider=DemoModel(delay_seconds=DEMO_DELAY)) as app:
        port = app.adapter.port
        client = client_for(port, key=None)
        raw = await client.chat.completions.with_raw_response.create(
            model="reveille-demo", messages=user("run in the background: echo keyless")
        )
        session_id = raw.headers[HEADER]

        async def woken() -> bool:
            rows = await messages(port, session_id)
            return any(r["content"].startswith(WAKE_MARKER) for r in rows) and (
                rows[-1]["role"] == "assistant"
            )

        await poll(woken)
        with pytest.raises(openai.PermissionDeniedError):
            await client.chat.completions.create(
                model="reveille-demo", messages=user("x"), extra_headers={HEADER: session_id}
            )


async def test_a_stray_key_error_releases_and_never_drops(gateway, runtime, monkeypatch) -> None:
    # Only the domain error SessionGone means "the session is gone"; a KeyError from a bug
    # in a delivery target must keep the result in the ledger for another attempt.
    app, _provider = gateway
    make_session(app.store, "sess_bug")
    evt = finished_process(runtime.ledger, "proc_bug", origin_session_id="sess_bug")

    async def buggy(*args, **kwargs):
        raise KeyError("session_id")

    monkeypatch.setattr("gateway.delivery_targets.deliver_wake", buggy)
    assert await app.runner.handle_event(evt) == "released"
    row = get_durable_delegation("proc_bug")
    assert row["delivery_state"] == "pending" and row["delivery_attempts"] == 1


class _FakePushAdapter:
    """A push-capable chat adapter as deliver_wake sees one: it records internal events."""

    supports_async_delivery = True

    def __init__(self) -> None:
        self.events: list = []

    async def handle_message(self, event) -> None:
        self.events.append(event)


async def test_completions_route_through_the_target_of_the_sessions_platform(
    gateway, runtime
) -> None:
    from gateway.config import Platform
    from gateway.delivery_targets import PushTarget
    from gateway.session import SessionSource

    app, _provider = gateway
    source = SessionSource(platform=Platform.TELEGRAM, chat_id="4242", user_id="7")
    make_session(app.store, "sess_tg", source=source)

    def pending(row_id: str) -> dict:
        return finished_process(
            runtime.ledger, row_id, origin_session_id="sess_tg", command="echo hi", exit_code=0
        )

    # No Telegram target in this process: released without spending an attempt.
    evt = pending("proc_tg_wait")
    assert await app.runner.handle_event(evt) == "released"
    row = get_durable_delegation("proc_tg_wait")
    assert row["delivery_state"] == "pending" and row["delivery_attempts"] == 0

    push = _FakePushAdapter()
    app.runner.register_target(Platform.TELEGRAM, PushTarget(push))
    evt = pending("proc_tg")
    assert await app.runner.handle_event(evt) == "delivered"
    assert get_durable_delegation("proc_tg")["delivery_state"] == "delivered"
    # One wake-up; the released row, re-offered once its backoff ended, may have joined it
    # (a combined wake-up, keyed by both ids).
    event = push.events[0]
    assert event.internal and event.source.chat_id == "4242"
    woken = sorted(str(m.get("delivery_id")) for m in read_wake_data(event.text))
    assert "proc_tg" in woken and set(woken) <= {"proc_tg", "proc_tg_wait"}
    assert event.metadata["idempotency_key"] == wake_batch_key(woken)
    assert event.text.startswith(WAKE_MARKER) and "echo hi" in event.text
