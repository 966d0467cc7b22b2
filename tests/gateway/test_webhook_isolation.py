"""No receiver can stall or swell the webhook sender (issue 29, item 2), against real
receivers on loopback: a huge answer is read only up to the cap, a hanging receiver holds
back nobody else's webhooks, a failing one trips its breaker (logged once, rows kept owed)
and recovers, ``Retry-After`` is honoured. The figures (RSS, lateness) are in
``bench/webhooks.py``; these tests assert the properties only."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from prometheus_client.exposition import generate_latest

import storage
from delivery.webhooks_backend import DELIVERED, PENDING, WebhookBackend
from gateway.webhook_breaker import RECOVERED, TRIPPED, Breaker
from gateway.webhooks import WebhookPolicy, WebhookSender, _retry_after
from reveille.metrics import Metrics
from tests.gateway.test_webhooks import SECRET, sending, settled
from tests.gateway.webhook_receiver import WebhookReceiver

MIB = 1024 * 1024


@pytest.fixture
def store(tmp_path: Path) -> Iterator[WebhookBackend]:
    backend = storage.sqlite_files(ledger=tmp_path / "ledger.db").open_webhooks()
    yield backend
    backend.close()


def rss_mib() -> float:
    """This process's resident set now (Linux), for the log."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class HugeAnswers:
    """A receiver whose 200 answer streams ``size`` bytes from a generator, counting what it
    managed to write before its reader went away."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.written: list[int] = []
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(status=200)
        resp.content_length = self.size
        await resp.prepare(request)
        chunk = b"x" * MIB
        sent = 0
        try:
            while sent < self.size:
                await resp.write(chunk)  # waits while the reader does not read
                sent += len(chunk)
        except (ConnectionError, RuntimeError):
            pass  # the sender closed the connection: the rest was never wanted
        finally:
            self.written.append(sent)
        return resp

    async def __aenter__(self) -> HugeAnswers:
        app = web.Application()
        app.router.add_post("/hook", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/hook"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


async def test_four_answers_of_400_mib_are_read_only_up_to_the_cap(
    store: WebhookBackend,
) -> None:
    before = rss_mib()
    async with HugeAnswers(400 * MIB) as huge, sending(store, huge.url) as sender:
        ids = [await sender.aenqueue("response.completed", f"resp_{i}") for i in range(4)]
        for delivery_id in ids:
            await settled(store, delivery_id)
        async with asyncio.timeout(30):  # the handlers notice the closed connections
            while len(huge.written) < 4:
                await asyncio.sleep(0.02)
    after = rss_mib()
    print(f"RSS with 4 x 400 MiB answers: {before:.0f} -> {after:.0f} MiB")
    assert [store.deliveries(i)[0].state for i in ids] == [DELIVERED] * 4
    # What the receivers got out before the sender hung up: socket buffers, not the body.
    assert all(n < 64 * MIB for n in huge.written), huge.written


async def test_a_hanging_receiver_holds_back_nobody_elses_webhooks(
    store: WebhookBackend,
) -> None:
    """100 events owed to a receiver that accepts and never answers and to a healthy one:
    every one reaches the healthy receiver while the hanging one's first sends still hang
    (on main a pass waited for the hanging rows it had claimed beside the healthy ones)."""
    hanging, healthy = WebhookReceiver(stall=True), WebhookReceiver()
    await hanging.start()
    await healthy.start()
    patient = WebhookPolicy(
        first_retry_seconds=0.05,
        max_retry_seconds=0.2,
        timeout_seconds=120.0,  # the hanging sends outlast the test
        lease_seconds=240.0,
        poll_seconds=0.2,
    )
    sender = WebhookSender(
        store, [hanging.url, healthy.url], secret=SECRET, consumer="test", policy=patient
    )
    for i in range(100):  # owed before the sender starts: the backlog of a restart
        sender.enqueue("response.completed", f"resp_{i}")
    await sender.start()
    try:
        await healthy.wait_for(100, timeout=60)
        ids = {r.id for r in store.recent(1000)}
        async with asyncio.timeout(30):
            while not all(
                r.state == DELIVERED
                for i in ids
                for r in store.deliveries(i)
                if r.endpoint == healthy.url
            ):
                await asyncio.sleep(0.02)
        # The hanging receiver's first sends are still in flight: nothing of it settled,
        # and its lane never took more than its own slots.
        await hanging.wait_for(patient.in_flight_per_endpoint)
        assert len(hanging.received) == patient.in_flight_per_endpoint
        stuck = [r for i in ids for r in store.deliveries(i) if r.endpoint == hanging.url]
        assert len(stuck) == 100 and all(r.state == PENDING and r.attempts == 0 for r in stuck)
        assert sorted(healthy.accepted_ids) == sorted(ids)
    finally:
        hanging.release()
        await sender.stop()
        await hanging.stop()
        await healthy.stop()


async def test_a_failing_endpoint_trips_once_keeps_its_rows_owed_and_recovers(
    store: WebhookBackend, caplog: pytest.LogCaptureFixture
) -> None:
    receiver = WebhookReceiver(status=500)
    await receiver.start()
    policy = WebhookPolicy(
        first_retry_seconds=0.01,
        max_retry_seconds=0.02,
        timeout_seconds=5.0,
        lease_seconds=10.0,
        poll_seconds=0.2,
        breaker_failures=3,
        breaker_open_seconds=0.05,
        breaker_max_open_seconds=0.1,
    )
    caplog.set_level(logging.INFO, logger="gateway.webhooks")
    try:
        async with sending(store, receiver.url, policy=policy) as sender:
            ids = [await sender.aenqueue("response.failed", f"resp_{i}") for i in range(10)]
            await receiver.wait_for(12)  # tripped after 3, then probes (one at a time)
            rows = [r for i in ids for r in store.deliveries(i)]
            assert all(r.state == PENDING for r in rows)  # owed, whatever the breaker says
            # An open breaker claims nothing: the rows it held back spent no attempt.
            assert sum(1 for r in rows if r.attempts == 0) >= 1
            receiver.status = 200
            for delivery_id in ids:
                await settled(store, delivery_id)
    finally:
        await receiver.stop()
    assert sorted(receiver.accepted_ids) == sorted(ids)
    trips = [r.getMessage() for r in caplog.records if "tripped" in r.getMessage()]
    recoveries = [r.getMessage() for r in caplog.records if "recovered" in r.getMessage()]
    assert len(trips) == 1 and "HTTP 500" in trips[0] and receiver.url in trips[0]
    assert len(recoveries) == 1


async def test_retry_after_holds_the_row_and_the_endpoint(store: WebhookBackend) -> None:
    receiver = WebhookReceiver(status=429, answer_headers={"Retry-After": "50"})
    await receiver.start()
    policy = WebhookPolicy(max_retry_seconds=100.0, poll_seconds=0.2, first_retry_seconds=0.05)
    try:
        async with sending(store, receiver.url, policy=policy) as sender:
            delivery_id = await sender.aenqueue("response.completed", "resp_1")
            async with asyncio.timeout(30):
                while not store.attempts(delivery_id):
                    await asyncio.sleep(0.02)
            (attempt,) = store.attempts(delivery_id)
            (row,) = store.deliveries(delivery_id)
            assert (attempt.status, row.state) == (429, PENDING)
            assert row.next_attempt_at >= attempt.at + 50  # not the 0.05 s backoff
            assert sender._lanes[receiver.url].breaker.hold_until >= attempt.at + 50
    finally:
        await receiver.stop()


def test_retry_after_reads_seconds_and_dates_and_ignores_the_rest() -> None:
    now = 1_000_000.0
    assert _retry_after("120", now) == 120.0
    assert _retry_after("Thu, 01 Jan 1970 00:00:00 GMT", now) == 0.0
    assert _retry_after("Mon, 12 Jan 1970 13:50:00 GMT", now) == pytest.approx(200.0)
    for bad in (None, "", "soon", "-5", "1.5"):
        assert _retry_after(bad, now) is None
    assert _retry_after("9" * 40, now) == 10.0**9  # capped before any arithmetic


def test_the_breaker_opens_probes_once_and_closes() -> None:
    b = Breaker(failures=3, open_seconds=10.0, max_open_seconds=25.0)
    assert [b.record(False, 0.0) for _ in range(3)] == [None, None, TRIPPED]
    assert b.allowance(5.0, 4) == 0 and b.next_change_at() == 10.0
    assert b.allowance(10.0, 4) == 1  # half-open: one probe
    assert b.allowance(10.5, 4) == 1  # still that one probe, not another
    assert b.record(False, 11.0) is None  # failed probe: not news, but a longer wait
    assert b.allowance(30.0, 4) == 0 and b.next_change_at() == 31.0
    assert b.allowance(31.0, 4) == 1
    assert b.record(True, 31.5) == RECOVERED
    assert b.allowance(31.5, 4) == 4 and b.failed_in_a_row == 0


def test_retry_after_holds_an_endpoint_whatever_its_breaker_says() -> None:
    b = Breaker(failures=5)
    b.record(False, 0.0, retry_after=30.0)
    assert b.allowance(29.0, 4) == 0 and b.allowance(30.0, 4) == 4


async def test_metrics_show_each_endpoints_obligations(store: WebhookBackend) -> None:
    sender = WebhookSender(store, ["http://127.0.0.1:9/a", "http://127.0.0.1:9/b"])
    sender.enqueue("response.completed", "resp_1")
    metrics = Metrics()
    metrics.webhook_stats = store.endpoint_stats
    text = generate_latest(metrics.registry).decode()
    for name in ("owed", "delivered", "failed", "oldest_owed_age_seconds"):
        for endpoint in sender.urls:
            assert f'reveille_webhook_{name}{{endpoint="{endpoint}"}}' in text
    assert 'reveille_webhook_owed{endpoint="http://127.0.0.1:9/a"} 1.0' in text
    # A token in an endpoint's query or credentials is no label: such endpoints add up.
    WebhookSender(store, ["https://u:pw@hooks.test/x?token=s3cret"]).enqueue("response.failed", "r")
    WebhookSender(store, ["https://hooks.test/x?token=other"]).enqueue("response.failed", "r")
    text = generate_latest(metrics.registry).decode()
    assert "s3cret" not in text and "other" not in text and "pw" not in text
    assert 'reveille_webhook_owed{endpoint="https://hooks.test/x"} 2.0' in text


@pytest.mark.parametrize(
    "bad",
    [
        {"in_flight_per_endpoint": 0},
        {"breaker_failures": 0},
        {"connect_timeout_seconds": 0},
        {"answer_cap_bytes": -1},
    ],
)
def test_a_policy_that_could_not_send_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        WebhookPolicy(**bad)  # type: ignore[arg-type]
