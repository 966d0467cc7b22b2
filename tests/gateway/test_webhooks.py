"""Signed webhooks end to end against real receivers on loopback: what the official client's
verifier accepts, what it rejects, retries until a receiver is back, 410 Gone, the retry
window, secret rotation, and pending webhooks surviving a restart."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import openai
import pytest

import storage
from delivery.webhooks_backend import DELIVERED, DROPPED, PENDING, WebhookBackend
from gateway.webhooks import (
    DELEGATION_COMPLETED,
    WebhookPolicy,
    WebhookSender,
    delivery_id_for,
    new_secret,
)
from tests.gateway.webhook_receiver import Received, WebhookReceiver

SECRET = new_secret()
CHILD = Path(__file__).with_name("webhook_child.py")
FAST = WebhookPolicy(
    first_retry_seconds=0.05,
    max_retry_seconds=0.2,
    timeout_seconds=5.0,
    lease_seconds=10.0,
    poll_seconds=0.2,
    breaker_open_seconds=0.05,
    breaker_max_open_seconds=0.2,
)


def unwrap(got: Received, secret: str = SECRET) -> object:
    client = openai.OpenAI(api_key="unused", base_url="http://127.0.0.1:9/v1")
    return client.webhooks.unwrap(got.body, got.headers, secret=secret)


def open_store(path: Path) -> WebhookBackend:
    return storage.sqlite_files(ledger=path / "ledger.db").open_webhooks()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[WebhookBackend]:
    backend = open_store(tmp_path)
    yield backend
    backend.close()


@pytest.fixture
async def receiver() -> AsyncIterator[WebhookReceiver]:
    r = WebhookReceiver()
    await r.start()
    yield r
    await r.stop()


@contextlib.asynccontextmanager
async def sending(
    store: WebhookBackend, *urls: str, secret: str = SECRET, policy: WebhookPolicy = FAST
) -> AsyncIterator[WebhookSender]:
    sender = WebhookSender(store, urls, secret=secret, consumer="test-server", policy=policy)
    await sender.start()
    try:
        yield sender
    finally:
        await sender.stop()


async def settled(store: WebhookBackend, delivery_id: str, *, timeout: float = 30.0) -> None:
    """Until every endpoint's row of the event left pending (a deadline, not a speed claim)."""
    async with asyncio.timeout(timeout):
        while True:
            rows = await asyncio.to_thread(store.deliveries, delivery_id)
            if rows and all(r.state != PENDING for r in rows):
                return
            await asyncio.sleep(0.02)


async def test_every_webhook_verifies_with_the_official_client(
    store: WebhookBackend, receiver: WebhookReceiver
) -> None:
    events = [
        ("response.completed", "resp_1"),
        ("response.failed", "resp_2"),
        (DELEGATION_COMPLETED, "deleg_abc"),
    ]
    async with sending(store, receiver.url) as sender:
        ids = [await sender.aenqueue(kind, obj) for kind, obj in events]
        for delivery_id in ids:
            await settled(store, delivery_id)
    assert ids == [delivery_id_for(kind, obj) for kind, obj in events]
    by_id = {got.headers["webhook-id"]: got for got in receiver.received}
    for (kind, obj), delivery_id in zip(events, ids, strict=True):
        got = by_id[delivery_id]
        event = unwrap(got)
        assert (event.id, event.type) == (delivery_id, kind)  # type: ignore[attr-defined]
        payload = json.loads(got.body)
        assert set(payload) == {"object", "id", "type", "created_at", "data"}
        assert payload["object"] == "event" and payload["data"] == {"id": obj}
        assert isinstance(payload["created_at"], int)
        assert abs(payload["created_at"] - time.time()) < 3600
        assert got.headers["content-type"] == "application/json"
    assert [r.state for i in ids for r in store.deliveries(i)] == [DELIVERED] * 3


async def test_a_tampered_webhook_is_rejected(
    store: WebhookBackend, receiver: WebhookReceiver
) -> None:
    async with sending(store, receiver.url) as sender:
        await settled(store, await sender.aenqueue("response.completed", "resp_1"))
    got = receiver.received[0]
    unwrap(got)
    forged = [
        Received(got.headers, got.body.replace(b"resp_1", b"resp_2")),
        Received({**got.headers, "webhook-id": "evt_other"}, got.body),
        Received({**got.headers, "webhook-timestamp": str(int(time.time()) + 5)}, got.body),
    ]
    for bad in forged:
        with pytest.raises(openai.InvalidWebhookSignatureError):
            unwrap(bad)
    with pytest.raises(openai.InvalidWebhookSignatureError):
        unwrap(got, secret=new_secret())


async def test_one_event_is_owed_once(store: WebhookBackend, receiver: WebhookReceiver) -> None:
    sender = WebhookSender(store, [receiver.url], secret=SECRET, policy=FAST)
    # Written before anything is sent (the sender is not even running): the obligation.
    first = sender.enqueue("response.completed", "resp_1")
    assert sender.on_terminal("resp_1", "response.completed") == first  # again: same event
    assert await sender.aon_terminal("resp_1", "response.completed") == first
    (row,) = store.deliveries(first)
    assert (row.state, row.attempts, row.event_type, row.object_id) == (
        PENDING,
        0,
        "response.completed",
        "resp_1",
    )
    async with sending(store, receiver.url) as running:
        await settled(store, first)
        second = await running.aenqueue("response.completed", "resp_2")
        await settled(store, second)
    assert [r.headers["webhook-id"] for r in receiver.received] == [first, second]


async def test_a_receiver_that_is_down_gets_every_event_once_it_is_back(
    store: WebhookBackend, receiver: WebhookReceiver
) -> None:
    await receiver.stop()  # refused connections from here on
    async with sending(store, receiver.url) as sender:
        ids = [await sender.aenqueue("response.completed", f"resp_{i}") for i in range(5)]
        async with asyncio.timeout(30):
            # every row tried once, then the breaker's probes (one row at a time)
            while sum(r.attempts for i in ids for r in store.deliveries(i)) < 8:
                await asyncio.sleep(0.02)
        receiver.status = 503  # back, but failing: still retried
        await receiver.start()
        await receiver.wait_for(2)
        receiver.status = 200
        for delivery_id in ids:
            await settled(store, delivery_id)
    assert sorted(receiver.accepted_ids) == sorted(ids)  # as a deduping receiver sees it
    seen = []
    for delivery_id in ids:
        assert store.deliveries(delivery_id)[0].state == DELIVERED
        outcomes = [(a.outcome, a.status) for a in store.attempts(delivery_id)]
        assert outcomes[0] == ("retry", None) and outcomes[-1] == ("delivered", 200)
        assert all(a.error for a in store.attempts(delivery_id) if a.status is None)
        seen += outcomes
    assert ("retry", 503) in seen


async def test_410_gone_stops_that_endpoint_only(store: WebhookBackend) -> None:
    gone, live = WebhookReceiver(status=410), WebhookReceiver()
    await gone.start()
    await live.start()
    try:
        async with sending(store, gone.url, live.url) as sender:
            delivery_id = await sender.aenqueue("response.cancelled", "resp_1")
            await settled(store, delivery_id)
    finally:
        await gone.stop()
        await live.stop()
    rows = {r.endpoint: r for r in store.deliveries(delivery_id)}
    assert (rows[gone.url].state, rows[gone.url].attempts) == (DROPPED, 1)
    assert "410" in (rows[gone.url].settled_reason or "")
    assert rows[live.url].state == DELIVERED
    assert len(gone.received) == 1 and len(live.received) == 1
    # The same id and body went to both endpoints.
    assert gone.received[0].body == live.received[0].body
    assert store.next_due_at() is None  # nothing more is owed to anyone


async def test_only_2xx_counts_and_the_retry_window_ends_in_dropped(
    store: WebhookBackend, receiver: WebhookReceiver
) -> None:
    receiver.status = 302  # a redirect is not followed and does not count
    short = WebhookPolicy(
        first_retry_seconds=0.05,
        max_retry_seconds=0.1,
        max_age_seconds=0.5,
        poll_seconds=0.2,
        breaker_open_seconds=0.05,
    )
    async with sending(store, receiver.url, policy=short) as sender:
        delivery_id = await sender.aenqueue("response.incomplete", "resp_1")
        await settled(store, delivery_id)
    (row,) = store.deliveries(delivery_id)
    assert row.state == DROPPED and row.attempts >= 2
    assert "no 2xx within" in (row.settled_reason or "") and "HTTP 302" in (
        row.settled_reason or ""
    )
    assert receiver.accepted_ids == []


def test_backoff_doubles_up_to_the_cap() -> None:
    policy = WebhookPolicy(first_retry_seconds=5, max_retry_seconds=60)
    assert [policy.retry_delay(n) for n in range(1, 7)] == [5, 10, 20, 40, 60, 60]
    assert WebhookPolicy().max_age_seconds == 72 * 3600


async def test_a_rotated_secret_signs_beside_the_new_one_for_24_hours(
    store: WebhookBackend, receiver: WebhookReceiver
) -> None:
    old, new, older = new_secret(), new_secret(), new_secret()
    now = time.time()
    day = 24 * 3600.0
    store.rotate_secret(older, now - 3 * day, day)
    store.rotate_secret(old, now - 2 * day, day)  # ``older`` expired a day ago
    store.rotate_secret(new, now - 3600, day)  # ``old`` stays valid 23 h more
    async with sending(store, receiver.url, secret="") as sender:
        await sender.aenqueue("response.completed", "resp_1")
        await receiver.wait_for(1)
    got = receiver.received[0]
    assert len(got.headers["webhook-signature"].split()) == 2
    unwrap(got, secret=new)
    unwrap(got, secret=old)  # a receiver not yet switched still verifies
    with pytest.raises(openai.InvalidWebhookSignatureError):
        unwrap(got, secret=older)


async def test_without_any_secret_nothing_is_sent_and_nothing_is_lost(
    store: WebhookBackend, receiver: WebhookReceiver
) -> None:
    async with sending(store, receiver.url, secret="") as sender:
        delivery_id = await sender.aenqueue("response.completed", "resp_1")
        assert await sender.send_due() == 0
        store.rotate_secret(SECRET, time.time(), 60)
        await receiver.wait_for(1)
        await settled(store, delivery_id)
    unwrap(receiver.received[0])


async def test_pending_webhooks_survive_a_restart(
    tmp_path: Path, receiver: WebhookReceiver
) -> None:
    await receiver.stop()
    first = open_store(tmp_path)
    try:
        async with sending(first, receiver.url) as sender:
            delivery_id = await sender.aenqueue("response.completed", "resp_1")
            async with asyncio.timeout(30):
                while not first.attempts(delivery_id):
                    await asyncio.sleep(0.02)
    finally:
        first.close()
    await receiver.start()
    second = open_store(tmp_path)  # the next start, on the same file
    try:
        async with sending(second, receiver.url):
            await settled(second, delivery_id)
        assert second.deliveries(delivery_id)[0].state == DELIVERED
    finally:
        second.close()
    assert receiver.accepted_ids == [delivery_id]


async def spawn_sender(path: Path, url: str, count: int) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(CHILD),
        str(path),
        url,
        SECRET,
        str(count),
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    async with asyncio.timeout(60):
        assert await proc.stdout.readline() == b"ENQUEUED\n"
    return proc


async def test_sigkill_mid_send_then_a_restart_delivers_each_event_once(
    tmp_path: Path, receiver: WebhookReceiver
) -> None:
    """The server dies (SIGKILL) with every send in flight; the next one takes the rows over
    when their lease runs out. A receiver deduping on webhook-id sees each event once; raw,
    it saw each twice (the killed send and the one after): the at-most-one extra delivery."""
    path = tmp_path / "ledger.db"
    ids = [delivery_id_for("response.completed", f"resp_{i}") for i in range(3)]
    receiver.stall = True
    first = await spawn_sender(path, receiver.url, 3)
    try:
        await receiver.wait_for(3)  # all three in flight, unanswered
    finally:
        first.kill()
        await first.wait()
    receiver.release()
    second = await spawn_sender(path, receiver.url, 0)  # the restart enqueues nothing new
    store = open_store(tmp_path)
    try:
        for delivery_id in ids:
            await settled(store, delivery_id)
        # The killed sends were never recorded: each row shows the one that counted.
        for delivery_id in ids:
            assert [a.outcome for a in store.attempts(delivery_id)] == ["delivered"]
            assert store.deliveries(delivery_id)[0].state == DELIVERED
    finally:
        second.kill()
        await second.wait()
        store.close()
    assert sorted(receiver.accepted_ids) == sorted(ids)
    raw = Counter(r.headers["webhook-id"] for r in receiver.received)
    assert raw == {delivery_id: 2 for delivery_id in ids}
    for got in receiver.received:
        unwrap(got)


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_two_servers_on_one_store_send_each_event_once(
    kind: str, tmp_path: Path, receiver: WebhookReceiver
) -> None:
    """Whichever server claims a row sends it; the other never sends it too."""
    if kind == "postgres":
        from tests.pg_support import fresh_url

        url = fresh_url()
        stores = [storage.open_storage(url).open_webhooks() for _ in range(2)]
    else:
        stores = [open_store(tmp_path), open_store(tmp_path)]
    senders = [
        WebhookSender(s, [receiver.url], secret=SECRET, consumer=f"server-{i}", policy=FAST)
        for i, s in enumerate(stores)
    ]
    try:
        for sender in senders:
            await sender.start()
        ids = [await senders[i % 2].aenqueue("response.completed", f"r{i}") for i in range(20)]
        for delivery_id in ids:
            await settled(stores[0], delivery_id)
    finally:
        for sender in senders:
            await sender.stop()
        for s in stores:
            s.close()
    raw = Counter(r.headers["webhook-id"] for r in receiver.received)
    assert raw == {delivery_id: 1 for delivery_id in ids}
