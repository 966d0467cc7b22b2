"""Socket Mode against the stand-in: the handshake (``apps.connections.open`` with the
app-level token, ``hello``), envelopes acknowledged by ``envelope_id`` once stored, Slack's
``disconnect`` answered by a new socket, an event delivered twice answered once; and how
Slack's refusals map onto the port (429 with ``Retry-After``, a chat that is gone)."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.async_slack_response import AsyncSlackResponse

import tools.async_delegation as ad
from agent.providers.demo import DemoModel
from gateway.surfaces.port import Refusal
from gateway.surfaces.slack import socket as socket_mode
from gateway.surfaces.slack.adapter import SlackTokenRefused, surface_error
from reveille.app import App, serve
from reveille.settings import Settings
from tests.api_server.serve_support import wait_until
from tests.surfaces.slack_fake import FakeSlack, dm_channel, visible
from tools.process_registry import process_registry

OWNER = "U0OWNER"


@pytest.fixture
def fake() -> Iterator[FakeSlack]:
    slack = FakeSlack()
    yield slack
    slack.stop()


@pytest.fixture
async def app(
    tmp_path: Path, fake: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[App]:
    monkeypatch.setenv("REVEILLE_HOME", str(tmp_path))
    ad.reset_runtime()
    settings = Settings(
        home=tmp_path,
        port=0,
        webui_port=0,
        api_key="k",
        slack_bot_token=fake.bot_token,
        slack_app_token=fake.app_token,
        slack_base_url=fake.base_url,
        slack_allowed_users=OWNER,
    )
    async with serve(settings, provider=DemoModel(delay_seconds=0.0)) as running:
        yield running
    ad.reset_runtime()
    process_registry.completion_queue.drain()


async def _until(check: Any, timeout: float = 20.0) -> Any:
    return await asyncio.to_thread(wait_until, check, timeout)


def _replies(fake: FakeSlack) -> list[str]:
    return [visible(s.text) for s in fake.messages_to(dm_channel(OWNER))]


async def test_the_handshake_and_acknowledged_envelopes(app: App, fake: FakeSlack) -> None:
    await _until(lambda: fake.hellos >= 1)
    assert fake.connections_opened == 2  # the start's check of the app token, the socket's
    fake.say("are you there", user=OWNER)
    await _until(lambda: any("are you there" in t for t in _replies(fake)))
    assert fake.acked_types == ["events_api"]


async def test_a_disconnect_opens_a_new_socket_and_nothing_is_lost(
    app: App, fake: FakeSlack
) -> None:
    await _until(lambda: fake.hellos >= 1)
    fake.disconnect()
    await _until(lambda: fake.connections_opened >= 3 and fake.hellos >= 2)
    fake.say("after the refresh", user=OWNER)
    await _until(lambda: any("after the refresh" in t for t in _replies(fake)))


async def test_an_event_delivered_twice_is_answered_once(app: App, fake: FakeSlack) -> None:
    body = fake.message_envelope("just once", user=OWNER)
    for attempt in (0, 1):
        fake.push(
            {
                "envelope_id": secrets.token_hex(8),
                "type": "events_api",
                "payload": body,
                "retry_attempt": attempt,
                "retry_reason": "timeout" if attempt else "",
            }
        )
    await _until(lambda: len(fake.acked) == 2)
    await _until(lambda: any("just once" in t for t in _replies(fake)))
    await asyncio.sleep(1.0)
    assert len(_replies(fake)) == 1


def _error(status: int, error: str, headers: dict[str, str] | None = None) -> SlackApiError:
    response = AsyncSlackResponse(
        client=AsyncWebClient(),
        http_verb="POST",
        api_url="https://slack.com/api/chat.postMessage",
        req_args={},
        data={"ok": False, "error": error},
        headers=headers or {},
        status_code=status,
    )
    return SlackApiError(error, response)


def test_slacks_refusals_as_the_port_reads_them() -> None:
    limited = surface_error(_error(429, "ratelimited", {"Retry-After": "7"}))
    assert (limited.kind, limited.retry_after) == (Refusal.RATE_LIMITED, 7.0)
    assert surface_error(_error(200, "channel_not_found")).kind is Refusal.GONE
    assert surface_error(_error(200, "is_archived")).kind is Refusal.GONE
    assert surface_error(_error(503, "service_unavailable")).kind is Refusal.TRANSIENT
    assert surface_error(_error(200, "invalid_blocks")).kind is Refusal.REFUSED
    assert surface_error(OSError("reset")).kind is Refusal.TRANSIENT


async def test_a_refused_bot_token_stops_the_start(
    tmp_path: Path, fake: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REVEILLE_HOME", str(tmp_path))
    settings = Settings(
        home=tmp_path,
        port=0,
        webui_port=0,
        api_key="k",
        slack_bot_token="xoxb-wrong",
        slack_app_token=fake.app_token,
        slack_base_url=fake.base_url,
    )
    with pytest.raises(SlackTokenRefused, match=r"SLACK_BOT_TOKEN .*invalid_auth"):
        async with serve(settings, provider=DemoModel(delay_seconds=0.0)):
            pass
    assert fake.connections_opened == 0


async def test_a_press_delivered_twice_is_stored_then_decided_once(
    tmp_path: Path, fake: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REVEILLE_HOME", str(tmp_path))
    ad.reset_runtime()
    settings = Settings(
        home=tmp_path,
        port=0,
        webui_port=0,
        api_key="k",
        shell_enabled=True,
        shell_approvals="always",
        slack_bot_token=fake.bot_token,
        slack_app_token=fake.app_token,
        slack_base_url=fake.base_url,
        slack_allowed_users=OWNER,
    )
    async with serve(settings, provider=DemoModel(delay_seconds=0.0)):
        await _until(lambda: fake.hellos >= 1)
        fake.say("run in the background: echo pressed", user=OWNER)

        def question() -> Any:
            return [s for s in fake.messages_to(dm_channel(OWNER)) if s.blocks]

        [asked] = await _until(question)
        fake.press(asked, "reveille_approve", by=OWNER, times=2)
        await _until(lambda: fake.acked_types.count("interactive") == 2)
        await _until(lambda: any("Result: pressed" in r for r in _replies(fake)))
        await asyncio.sleep(0.5)  # a second decision would have come by now
    assert fake.ephemeral == [(OWNER, "Approved.")]
    assert sum("finished" in r for r in _replies(fake)) == 1
    ad.reset_runtime()
    process_registry.completion_queue.drain()


async def test_a_refused_app_token_stops_the_start(
    tmp_path: Path, fake: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REVEILLE_HOME", str(tmp_path))
    settings = Settings(
        home=tmp_path,
        port=0,
        webui_port=0,
        api_key="k",
        slack_bot_token=fake.bot_token,
        slack_app_token="xapp-wrong",
        slack_base_url=fake.base_url,
    )
    with pytest.raises(SlackTokenRefused, match=r"SLACK_APP_TOKEN .*invalid_auth"):
        async with serve(settings, provider=DemoModel(delay_seconds=0.0)):
            pass
    assert fake.hellos == 0


async def _nothing(kind: str, payload: Any) -> None:
    return None


async def test_socket_mode_backs_off_on_failures_and_gives_up_on_a_refused_token(
    fake: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        await asyncio.sleep(0)

    monkeypatch.setattr(socket_mode, "_sleep", sleep)
    fake.connections_failing = 6
    mode = socket_mode.SocketMode(
        fake.app_token, fake.base_url, _nothing, first_delay=1.0, max_delay=8.0
    )
    task = asyncio.create_task(mode.run())
    try:
        await asyncio.wait_for(mode.connected.wait(), 20)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert waits == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    waits.clear()
    # Refused mid-life (the token revoked): the run ends, with no retry.
    refused = socket_mode.SocketMode("xapp-revoked", fake.base_url, _nothing)
    with pytest.raises(SlackTokenRefused, match="SLACK_APP_TOKEN"):
        await asyncio.wait_for(refused.run(), 20)
    assert waits == []


async def test_slash_commands_new_help_and_timers(app: App, fake: FakeSlack) -> None:
    await _until(lambda: fake.hellos >= 1)

    async def answer(text: str, user: str = OWNER) -> str:
        envelope = fake.command(text, user=user)
        payload = await _until(lambda: fake.ack_payloads.get(envelope))
        assert payload["response_type"] == "ephemeral"
        return str(payload["text"])

    assert "/reveille new" in await answer("help")
    assert "/reveille new" in await answer("")
    assert "nothing is scheduled" in (await answer("timers")).lower()
    first = await answer("new")
    second = await answer("new")
    previous = [t.split("session `")[1].rstrip("`).") for t in (first, second)]
    # The second names the session the first made: the chat's mapping moved, in the store.
    assert previous[0] != previous[1] and ":new-" in previous[1]
    assert "not on this bot's list" in await answer("new", user="U0STRANGER")
    fake.say("after new", user=OWNER)
    await _until(lambda: any("after new" in t for t in _replies(fake)))
