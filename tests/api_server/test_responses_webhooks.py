"""The Responses API and signed webhooks together, through real `reveille serve` processes.

Each terminal response sends one ``response.<status>`` webhook (data.id = the response id)
that the official client's ``webhooks.unwrap`` accepts; a SIGKILLed server's response ends
failed after the restart and its webhook is seen once by a receiver deduping on
``webhook-id``. The two crash windows of the hand-off: killed after the end was stored but
before its webhook was owed, the restart owes it (the sweep re-offers the hook); killed while
the webhook was in flight, the next claim sends it again: the one extra raw delivery, with
the same ``webhook-id``. A background delegation started by a response still sends
``reveille.delegation.completed`` alongside.

The model is ``FakeOpenAI`` (or the demo model), the receiver ``WebhookReceiver``, both on
loopback in the thread of ``ThreadedFake``'s event loop; the server is a subprocess.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp import web

import storage
from delivery.webhooks_backend import DELIVERED
from gateway.webhooks import DELEGATION_COMPLETED, delivery_id_for, new_secret
from tests.api_server.serve_support import Server, wait_until
from tests.api_server.test_responses_serve import ThreadedFake, client, model_env, upstream
from tests.gateway.webhook_receiver import Received, WebhookReceiver

__all__ = ["upstream"]  # the fixture, imported to be used here

SECRET = new_secret()


def on_loop(fake: ThreadedFake, work: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run_coroutine_threadsafe(work, fake.loop).result(10)


@pytest.fixture
def receiver(upstream: ThreadedFake) -> Iterator[WebhookReceiver]:
    found = WebhookReceiver()
    on_loop(upstream, found.start())
    yield found
    on_loop(upstream, found.stop())


def hooked_env(receiver: WebhookReceiver, **extra: str) -> dict[str, str]:
    return {"REVEILLE_WEBHOOK_URLS": receiver.url, "REVEILLE_WEBHOOK_SECRET": SECRET, **extra}


def unwrapped(got: Received) -> Any:
    """The event, as the official client verifies it (raises when the signature is wrong)."""
    verifier = openai.OpenAI(api_key="unused", base_url="http://127.0.0.1:9/v1")
    return verifier.webhooks.unwrap(got.body, got.headers, secret=SECRET)


def deliveries_of(receiver: WebhookReceiver, webhook_id: str) -> list[Received]:
    return [r for r in list(receiver.received) if r.headers.get("webhook-id") == webhook_id]


def the_webhook(receiver: WebhookReceiver, event_type: str, object_id: str) -> dict[str, Any]:
    """Waits for the event's webhook; it is verified and names the object."""
    webhook_id = delivery_id_for(event_type, object_id)
    got = wait_until(lambda: deliveries_of(receiver, webhook_id), timeout=30)[0]
    unwrapped(got)
    event = json.loads(got.body)
    assert event["type"] == event_type
    assert event["data"] == {"id": object_id}
    assert event["id"] == webhook_id
    return event


def settled_delivered(home: Path, webhook_id: str) -> None:
    """The store says the event was delivered (nothing is left to send after a restart)."""
    backend = storage.sqlite_files(ledger=home / "ledger.db").open_webhooks()
    try:
        wait_until(lambda: [d.state for d in backend.deliveries(webhook_id)] == [DELIVERED])
    finally:
        backend.close()


async def upstream_refuses(request: web.Request, body: dict[str, Any]) -> web.Response:
    # A 400: the provider does not retry it, so the turn fails at once.
    error = {"message": "the upstream refused this", "type": "invalid_request_error"}
    return web.json_response({"error": error}, status=400)


def test_each_terminal_response_sends_one_verified_webhook(
    tmp_path: Path, upstream: ThreadedFake, receiver: WebhookReceiver
) -> None:
    upstream.fake.script.append(upstream_refuses)  # the third response's model call
    home = tmp_path / "home"
    server = Server(home, extra_env=model_env(upstream, **hooked_env(receiver)))
    expected: list[str] = []
    try:
        api = client(server)
        upstream.open_gate()
        done = api.responses.create(model="fake-model", input="hi", background=True)
        wait_until(lambda: api.responses.retrieve(done.id).status == "completed")
        the_webhook(receiver, "response.completed", done.id)
        expected.append(delivery_id_for("response.completed", done.id))

        held = api.responses.create(model="fake-model", input="again", background=True)
        wait_until(lambda: upstream.second.started.is_set())
        assert api.responses.cancel(held.id).status == "cancelled"
        assert api.responses.cancel(held.id).status == "cancelled"  # idempotent: owed once
        the_webhook(receiver, "response.cancelled", held.id)
        expected.append(delivery_id_for("response.cancelled", held.id))

        broken = api.responses.create(model="fake-model", input="fail", background=True)
        ended = wait_until(
            lambda: (
                (r := api.responses.retrieve(broken.id)).status != "queued"
                and r.status != "in_progress"
                and r
            )
        )
        assert ended.status == "failed" and ended.error is not None
        the_webhook(receiver, "response.failed", broken.id)
        expected.append(delivery_id_for("response.failed", broken.id))
        for webhook_id in expected:
            settled_delivered(home, webhook_id)
    finally:
        assert server.stop() == 0
    # Stopped: nothing more can come. One delivery each, and nothing else was sent.
    assert receiver.accepted_ids == expected
    assert len(receiver.received) == len(expected)
    # A tampered body is refused by the same verifier.
    first = receiver.received[0]
    tampered = Received(first.headers, first.body.replace(b"response.", b"response.x"))
    with pytest.raises(openai.InvalidWebhookSignatureError):
        unwrapped(tampered)


def test_a_sigkilled_servers_response_fails_and_its_webhook_is_seen_once(
    tmp_path: Path, upstream: ThreadedFake, receiver: WebhookReceiver
) -> None:
    home = tmp_path / "home"
    env = model_env(upstream, **hooked_env(receiver))
    first = Server(home, extra_env=env)
    try:
        made = client(first).responses.create(model="fake-model", input="hi", background=True)
        wait_until(lambda: upstream.gate.started.is_set())
        assert client(first).responses.retrieve(made.id).status == "in_progress"
    finally:
        first.stop(signal.SIGKILL)
    assert receiver.received == []  # it never ended on the first server

    second = Server(home, extra_env=env)
    try:
        ended = wait_until(
            lambda: (r := client(second).responses.retrieve(made.id)).status != "in_progress" and r
        )
        assert ended.status == "failed"
        assert ended.error is not None and "stopped before it finished" in ended.error.message
        the_webhook(receiver, "response.failed", made.id)
        webhook_id = delivery_id_for("response.failed", made.id)
        settled_delivered(home, webhook_id)
    finally:
        assert second.stop() == 0
    # A third start owes nothing more: the delivery was recorded.
    third = Server(home, extra_env=env)
    try:
        assert client(third).responses.retrieve(made.id).status == "failed"
    finally:
        assert third.stop() == 0
    assert receiver.accepted_ids == [webhook_id]  # what a deduping receiver sees: once
    # Raw deliveries: one here; a crash between a send and its record could add one more
    # with the same webhook-id (README "### Webhooks").
    assert 1 <= len(deliveries_of(receiver, webhook_id)) <= 2
    assert len(receiver.received) == len(deliveries_of(receiver, webhook_id))


def test_a_server_killed_between_the_end_and_its_webhook_owes_it_after_the_restart(
    tmp_path: Path, upstream: ThreadedFake, receiver: WebhookReceiver
) -> None:
    home = tmp_path / "home"
    env = model_env(upstream, **hooked_env(receiver))
    first = Server(home, extra_env={**env, "REVEILLE_TEST_DIE_BEFORE_HOOK": "1"})
    try:
        upstream.open_gate()
        made = client(first).responses.create(model="fake-model", input="hi", background=True)
        first.wait_for(re.compile(rf"DYING-BEFORE-HOOK {made.id}"))
    finally:
        assert first.stop() == -signal.SIGKILL
    assert receiver.received == []

    second = Server(home, extra_env={**env, "REVEILLE_TEST_HOOK_RETRY_SECONDS": "0"})
    try:
        done = client(second).responses.retrieve(made.id)
        assert done.status == "completed" and done.output_text == "Hello world"
        the_webhook(receiver, "response.completed", made.id)
        webhook_id = delivery_id_for("response.completed", made.id)
        settled_delivered(home, webhook_id)
    finally:
        assert second.stop() == 0
    assert receiver.accepted_ids == [webhook_id]
    assert len(receiver.received) == 1


def test_a_server_killed_while_its_webhook_is_in_flight_sends_it_once_more(
    tmp_path: Path, upstream: ThreadedFake, receiver: WebhookReceiver
) -> None:
    """The one extra raw delivery the README documents: the send reached the receiver, the
    server died before recording the answer, so the next claim sends it again (same
    ``webhook-id``; a deduping receiver still sees it once)."""
    home = tmp_path / "home"
    env = model_env(upstream, **hooked_env(receiver, REVEILLE_TEST_WEBHOOK_LEASE_SECONDS="2"))
    receiver.stall = True  # the first delivery is held unanswered
    first = Server(home, extra_env=env)
    try:
        upstream.open_gate()
        made = client(first).responses.create(model="fake-model", input="hi", background=True)
        wait_until(lambda: receiver.received, timeout=30)
    finally:
        first.stop(signal.SIGKILL)
    upstream.loop.call_soon_threadsafe(receiver.release)  # back to answering 200

    second = Server(home, extra_env=env)
    try:
        webhook_id = delivery_id_for("response.completed", made.id)
        settled_delivered(home, webhook_id)
    finally:
        assert second.stop() == 0
    raw = deliveries_of(receiver, webhook_id)
    assert len(raw) == len(receiver.received) == 2  # the held one, then the resend
    for got in raw:
        unwrapped(got)
    assert receiver.accepted_ids == [webhook_id]


def test_a_delegation_started_by_a_response_sends_its_own_webhook_alongside(
    tmp_path: Path, upstream: ThreadedFake, receiver: WebhookReceiver
) -> None:
    home = tmp_path / "home"
    server = Server(home, extra_env=hooked_env(receiver))  # the demo model
    try:
        api = client(server)
        made = api.responses.create(
            model="reveille-demo", input="in the background: summarise the Q3 report",
            background=True,
        )  # fmt: skip
        wait_until(lambda: api.responses.retrieve(made.id).status == "completed")
        the_webhook(receiver, "response.completed", made.id)
        delegation = wait_until(
            lambda: [
                json.loads(r.body)
                for r in list(receiver.received)
                if json.loads(r.body)["type"] == DELEGATION_COMPLETED
            ]
        )[0]
        event = the_webhook(receiver, DELEGATION_COMPLETED, delegation["data"]["id"])
        settled_delivered(home, event["id"])
    finally:
        assert server.stop() == 0
    assert sorted(receiver.accepted_ids) == sorted(
        {delivery_id_for("response.completed", made.id), event["id"]}
    )
    assert len(receiver.received) == 2
