"""The HTTP Events API and interactivity on the API server's port, against an in-process
``serve`` whose Slack talks to the stand-in (``tests/surfaces/slack_fake.py``) and takes
events only by HTTP (a signing secret, no app token).

Attacks first: an unsigned, wrongly signed, stale (outside the 5-minute window), oversized,
non-JSON or non-UTF-8 request is refused and nothing of it is stored or answered; a lone
surrogate is answered, not a crash. Then the rules: ``url_verification`` is answered with its
challenge; an event re-sent with ``X-Slack-Retry-Num`` (or a signed request replayed inside the
window) is answered once; a press over ``/slack/interactivity`` decides only for the owner.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp
import pytest

import tools.async_delegation as ad
from agent.providers.demo import DemoModel
from gateway.surfaces.slack.http import MAX_BODY_BYTES, sign
from reveille.app import App, serve
from reveille.settings import Settings
from tests.api_server.serve_support import wait_until
from tests.surfaces.slack_fake import FakeSlack, dm_channel, visible
from tools.process_registry import process_registry

OWNER, OTHER = "U0OWNER", "U0OTHER"


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
    process_registry.completion_queue.drain()
    settings = Settings(
        home=tmp_path,
        port=0,
        webui_port=0,
        api_key="k",
        slack_bot_token=fake.bot_token,
        slack_signing_secret=fake.signing_secret,
        slack_base_url=fake.base_url,
        slack_allowed_users=f"{OWNER},{OTHER}",
    )
    async with serve(settings, provider=DemoModel(delay_seconds=0.0)) as running:
        yield running
    ad.reset_runtime()
    process_registry.completion_queue.drain()


def _url(app: App, path: str) -> str:
    return f"http://127.0.0.1:{app.adapter.port}{path}"


async def _post(
    app: App,
    path: str,
    body: bytes,
    *,
    secret: str,
    timestamp: str | None = None,
    signature: str | None = None,
    headers: dict[str, str] | None = None,
    content_type: str = "application/json",
) -> tuple[int, Any]:
    stamp = timestamp if timestamp is not None else str(int(time.time()))
    sent = {
        "Content-Type": content_type,
        "X-Slack-Request-Timestamp": stamp,
        "X-Slack-Signature": signature if signature is not None else sign(secret, stamp, body),
        **(headers or {}),
    }
    async with (
        aiohttp.ClientSession() as http,
        http.post(_url(app, path), data=body, headers=sent) as response,
    ):
        text = await response.text()
        try:
            return response.status, json.loads(text) if text else None
        except ValueError:
            return response.status, text


def _replies(fake: FakeSlack, user: str = OWNER) -> list[str]:
    return [visible(s.text) for s in fake.messages_to(dm_channel(user))]


async def _until(check: Any, timeout: float = 20.0) -> Any:
    return await asyncio.to_thread(wait_until, check, timeout)


def _event(fake: FakeSlack, text: str, **kw: Any) -> bytes:
    return json.dumps(fake.message_envelope(text, user=kw.pop("user", OWNER), **kw)).encode()


# --------------------------------------------------------------------------- attacks


async def test_requests_slack_did_not_sign_are_refused_and_not_answered(
    app: App, fake: FakeSlack
) -> None:
    secret = fake.signing_secret
    body = _event(fake, "forged")
    now = str(int(time.time()))
    wrong = sign("not-the-secret", now, body)
    stale = str(int(time.time()) - 301)
    assert (await _post(app, "/slack/events", body, secret=secret, signature=wrong))[0] == 401
    assert (await _post(app, "/slack/events", body, secret=secret, signature=""))[0] == 401
    # A request recorded and sent again after the window, signed right for its old time.
    assert (await _post(app, "/slack/events", body, secret=secret, timestamp=stale))[0] == 401
    assert (await _post(app, "/slack/events", body, secret=secret, timestamp="soon"))[0] == 401
    # The body signed is not the body sent.
    tampered = body.replace(b"forged", b"FORGED")
    status, _ = await _post(
        app, "/slack/events", tampered, secret=secret, signature=sign(secret, now, body)
    )
    assert status == 401
    assert (await _post(app, "/slack/interactivity", b"payload=%7B%7D", secret="x"))[0] == 401
    await asyncio.sleep(0.5)
    assert _replies(fake) == []


async def test_oversized_and_malformed_bodies_are_refused(app: App, fake: FakeSlack) -> None:
    secret = fake.signing_secret
    huge = b'{"type": "event_callback", "pad": "' + b"x" * MAX_BODY_BYTES + b'"}'
    assert (await _post(app, "/slack/events", huge, secret=secret))[0] == 413
    assert (await _post(app, "/slack/events", b"not json", secret=secret))[0] == 400
    assert (await _post(app, "/slack/events", b"\xff\xfe{}", secret=secret))[0] == 400
    assert (await _post(app, "/slack/events", b"[1, 2]", secret=secret))[0] == 400
    deep = b"[" * 100_000 + b"]" * 100_000
    assert (await _post(app, "/slack/events", deep, secret=secret))[0] in (400, 413)
    form = "application/x-www-form-urlencoded"
    bad = [b"payload=not-json", b"nothing=here", b"payload=%7B%7D&payload=%7B%7D"]
    for body in bad:
        status, _ = await _post(app, "/slack/interactivity", body, secret=secret, content_type=form)
        assert status == 400, body


async def test_a_lone_surrogate_is_answered_not_a_crash(app: App, fake: FakeSlack) -> None:
    body = _event(fake, "PLACEHOLDER").replace(b"PLACEHOLDER", b"half \\ud800 a pair")
    status, _ = await _post(app, "/slack/events", body, secret=fake.signing_secret)
    assert status == 200
    [reply] = await _until(lambda: _replies(fake))
    assert "half \ufffd a pair" in reply


# --------------------------------------------------------------------------- the rules


async def test_url_verification_is_answered_with_its_challenge(app: App, fake: FakeSlack) -> None:
    body = json.dumps({"type": "url_verification", "challenge": "c-123", "token": "t"}).encode()
    status, data = await _post(app, "/slack/events", body, secret=fake.signing_secret)
    assert (status, data) == (200, {"challenge": "c-123"})


async def test_a_resent_event_and_a_replayed_request_are_answered_once(
    app: App, fake: FakeSlack
) -> None:
    secret = fake.signing_secret
    body = _event(fake, "only once please")
    stamp = str(int(time.time()))
    assert (await _post(app, "/slack/events", body, secret=secret, timestamp=stamp))[0] == 200
    for retry in ("1", "2"):
        status, _ = await _post(
            app,
            "/slack/events",
            body,
            secret=secret,
            headers={"X-Slack-Retry-Num": retry, "X-Slack-Retry-Reason": "http_timeout"},
        )
        assert status == 200
    # The very request again (same timestamp and signature), inside the window.
    assert (await _post(app, "/slack/events", body, secret=secret, timestamp=stamp))[0] == 200
    await _until(lambda: any("only once please" in t for t in _replies(fake)))
    await asyncio.sleep(1.0)
    assert len(_replies(fake)) == 1


async def test_a_message_in_a_thread_is_answered_in_that_thread_as_its_own_conversation(
    app: App, fake: FakeSlack
) -> None:
    secret = fake.signing_secret
    channel = "C0GENERAL"
    top = _event(fake, "in the channel", channel=channel)
    threaded = _event(fake, "in the thread", channel=channel, thread_ts="1700000000.000100")
    for body in (top, threaded):
        assert (await _post(app, "/slack/events", body, secret=secret))[0] == 200
    await _until(lambda: len(fake.messages_to(channel)) == 2)
    by_thread = {s.thread_ts: visible(s.text) for s in fake.messages_to(channel)}
    assert "in the channel" in by_thread[None]
    assert "in the thread" in by_thread["1700000000.000100"]
    sessions = {s.id for s in await asyncio.to_thread(app.store.list_sessions)}
    assert len([s for s in sessions if "slack" in s]) == 2  # two conversations


async def test_an_app_mention_and_its_message_are_one_answer(app: App, fake: FakeSlack) -> None:
    secret = fake.signing_secret
    message = fake.message_envelope("hello bot", user=OWNER, channel="C0GENERAL")
    mention = json.loads(json.dumps(message))
    mention["event_id"] = "EvMENTION"
    mention["event"].update(type="app_mention", text="<@UBOT> hello bot")
    for body in (message, mention):
        data = json.dumps(body).encode()
        assert (await _post(app, "/slack/events", data, secret=secret))[0] == 200
    await _until(lambda: fake.messages_to("C0GENERAL"))
    await asyncio.sleep(1.0)
    assert len(fake.messages_to("C0GENERAL")) == 1


async def test_a_stranger_gets_nothing(app: App, fake: FakeSlack) -> None:
    body = _event(fake, "let me in", user="U0STRANGER")
    assert (await _post(app, "/slack/events", body, secret=fake.signing_secret))[0] == 200
    await asyncio.sleep(1.0)
    assert fake.messages_to(dm_channel("U0STRANGER")) == []


async def test_a_press_over_http_is_decided_by_the_owner_only(
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
        slack_signing_secret=fake.signing_secret,
        slack_base_url=fake.base_url,
        slack_allowed_users=f"{OWNER},{OTHER}",
    )
    secret = fake.signing_secret
    form = "application/x-www-form-urlencoded"
    async with serve(settings, provider=DemoModel(delay_seconds=0.0)) as app:
        body = _event(fake, "run in the background: echo pressed")

        def question() -> Any:
            return [s for s in fake.messages_to(dm_channel(OWNER)) if s.blocks]

        assert (await _post(app, "/slack/events", body, secret=secret))[0] == 200
        [asked] = await _until(question)
        for by in (OTHER, OWNER):
            payload = fake.press_payload(asked, "reveille_approve", by=by)
            data = urlencode({"payload": json.dumps(payload)}).encode()
            status, _ = await _post(
                app, "/slack/interactivity", data, secret=secret, content_type=form
            )
            assert status == 200
            await _until(lambda n=by: [u for u, _ in fake.ephemeral if u == n])
        answers = dict(fake.ephemeral)
        assert "not yours" in answers[OTHER].lower()
        assert answers[OWNER].lower().startswith("approved")
        await _until(lambda: not question())  # the buttons are gone: the verdict replaced it
    ad.reset_runtime()


async def test_a_slash_command_over_http_is_signed_and_answered_to_its_user(
    app: App, fake: FakeSlack
) -> None:
    form = "application/x-www-form-urlencoded"
    fields = {"command": "/reveille", "user_id": OWNER, "channel_id": dm_channel(OWNER)}
    body = urlencode({**fields, "text": "new"}).encode()
    secret = fake.signing_secret
    status, _ = await _post(app, "/slack/commands", body, secret="wrong-secret", content_type=form)
    assert status == 401
    status, answer = await _post(app, "/slack/commands", body, secret=secret, content_type=form)
    assert status == 200
    assert answer["response_type"] == "ephemeral"
    assert "new conversation" in answer["text"]
    help_body = urlencode({**fields, "text": "help"}).encode()
    status, answer = await _post(
        app, "/slack/commands", help_body, secret=secret, content_type=form
    )
    assert "/reveille timers" in answer["text"]
