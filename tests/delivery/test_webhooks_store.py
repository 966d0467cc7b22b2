"""The webhook store behaves the same on every backend: obligations written once, claimed
under a lease by one holder at a time, every attempt recorded, secrets rotated with overlap.
A version-1 ledger file gains the webhook tables when opened, its rows untouched."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

import storage
from delivery.webhooks_backend import (
    DELIVERED,
    DROPPED,
    PENDING,
    Settlement,
    WebhookAttempt,
    WebhookBackend,
    WebhookDelivery,
)
from storage.sqlite.ledger import SCHEMA_VERSION as LEDGER_SCHEMA_VERSION

KINDS = ["sqlite", "memory", "postgres"]


def open_store(kind: str, directory: Path) -> WebhookBackend:
    if kind == "sqlite":
        return storage.sqlite_files(ledger=directory / "ledger.db").open_webhooks()
    if kind == "memory":
        return storage.open_storage("memory://").open_webhooks()
    from tests.pg_support import fresh_url

    return storage.open_storage(fresh_url()).open_webhooks()


@pytest.fixture(params=KINDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[WebhookBackend]:
    backend = open_store(str(request.param), tmp_path)
    yield backend
    backend.close()


def row(delivery_id: str, endpoint: str, at: float = 100.0) -> WebhookDelivery:
    body = f'{{"id":"{delivery_id}"}}'
    return WebhookDelivery(
        delivery_id, endpoint, "response.completed", "resp_1", body, at, next_attempt_at=at
    )


def attempt(r: WebhookDelivery, at: float, outcome: str, status: int | None) -> WebhookAttempt:
    return WebhookAttempt(r.id, r.endpoint, at, "server-a", outcome, status)


def test_an_event_is_owed_once_per_endpoint(store: WebhookBackend) -> None:
    rows = [row("evt_1", "http://a/"), row("evt_1", "http://b/")]
    assert store.add(rows) == 2
    assert store.add(rows) == 0  # enqueued again: still owed once
    got = store.deliveries("evt_1")
    assert [(r.endpoint, r.state, r.attempts) for r in got] == [
        ("http://a/", PENDING, 0),
        ("http://b/", PENDING, 0),
    ]
    assert store.deliveries("evt_nope") == []


def test_a_claim_is_a_lease_held_by_one(store: WebhookBackend) -> None:
    store.add([row("evt_1", "http://a/", at=100.0), row("evt_2", "http://a/", at=101.0)])
    assert store.claim_due(99.0, "a", "tok-early", 60, 10) == []  # not due yet
    claimed = store.claim_due(200.0, "a", "tok-a", 60, 1)
    assert [(r.id, r.claim_token, r.claim_expires_at) for r in claimed] == [
        ("evt_1", "tok-a", 260.0)
    ]
    # Another server sees only the row nobody holds.
    assert [r.id for r in store.claim_due(200.0, "b", "tok-b", 60, 10)] == ["evt_2"]
    assert store.claim_due(259.0, "c", "tok-c", 60, 10) == []
    assert store.next_due_at() == 260.0
    # The holder died: its lease runs out and the row is taken over.
    taken = store.claim_due(260.0, "c", "tok-c", 60, 10)
    assert [r.id for r in taken] == ["evt_1", "evt_2"]


def test_settling_counts_the_attempt_only_under_the_claim(store: WebhookBackend) -> None:
    r = row("evt_1", "http://a/")
    store.add([r])
    store.claim_due(100.0, "a", "tok-a", 60, 10)
    retry = Settlement(PENDING, next_attempt_at=105.0)
    assert store.settle(attempt(r, 100.0, "retry", 503), "tok-a", retry)
    assert store.next_due_at() == 105.0
    assert store.claim_due(104.0, "a", "tok", 60, 10) == []
    store.claim_due(105.0, "a", "tok-b", 60, 10)
    # A stale holder's answer is recorded, but the row stays the new holder's.
    assert not store.settle(attempt(r, 106.0, "delivered", 200), "tok-a", Settlement(DELIVERED))
    assert store.deliveries("evt_1")[0].state == PENDING
    done = Settlement(DELIVERED, reason="HTTP 200")
    assert store.settle(attempt(r, 107.0, "delivered", 200), "tok-b", done)
    (settled,) = store.deliveries("evt_1")
    assert (settled.state, settled.attempts, settled.settled_at) == (DELIVERED, 2, 107.0)
    assert settled.settled_reason == "HTTP 200" and settled.claim_token is None
    assert [(a.outcome, a.status) for a in store.attempts("evt_1")] == [
        ("retry", 503),
        ("delivered", 200),
        ("delivered", 200),
    ]
    assert store.next_due_at() is None
    # Settled rows are never claimed again.
    assert store.claim_due(10_000.0, "a", "tok", 60, 10) == []


def test_dropped_rows_and_recent(store: WebhookBackend) -> None:
    a, b = row("evt_1", "http://a/", at=1.0), row("evt_2", "http://a/", at=2.0)
    store.add([a, b])
    store.claim_due(5.0, "x", "t", 60, 10)
    assert store.settle(attempt(a, 5.0, "dropped", 410), "t", Settlement(DROPPED, reason="410"))
    assert [r.id for r in store.recent(10)] == ["evt_2", "evt_1"]
    assert [r.id for r in store.recent(10, DROPPED)] == ["evt_1"]
    assert [r.id for r in store.recent(1)] == ["evt_2"]


def test_a_rotated_secret_stays_valid_for_the_overlap(store: WebhookBackend) -> None:
    assert store.secrets(0.0) == []
    store.rotate_secret("whsec_old", 10.0, 100.0)
    assert [(s.secret, s.expires_at) for s in store.secrets(10.0)] == [("whsec_old", None)]
    store.rotate_secret("whsec_new", 20.0, 100.0)
    assert [(s.secret, s.expires_at) for s in store.secrets(20.0)] == [
        ("whsec_new", None),
        ("whsec_old", 120.0),
    ]
    assert [s.secret for s in store.secrets(120.0)] == ["whsec_new"]


def test_a_version_1_ledger_gains_the_webhook_tables(tmp_path: Path) -> None:
    from storage.sqlite.ledger import _LEDGER_SCHEMA, APPLICATION_ID

    path = tmp_path / "ledger.db"
    conn = sqlite3.connect(path)
    conn.executescript(_LEDGER_SCHEMA)
    conn.execute(
        "INSERT INTO deliveries (id, kind, state, delivery_state, created_at, updated_at) "
        "VALUES ('deleg_1', 'delegation', 'running', 'pending', 1, 1)"
    )
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()

    ledger = storage.sqlite_files(ledger=path).open_ledger()
    try:
        row_1 = ledger.get("deleg_1")
        assert row_1 is not None and row_1.state == "running"
    finally:
        ledger.close()
    webhooks = storage.sqlite_files(ledger=path).open_webhooks()
    try:
        assert webhooks.add([row("evt_1", "http://a/")]) == 1
    finally:
        webhooks.close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone() == (LEDGER_SCHEMA_VERSION,)
    conn.close()


def test_a_claim_and_the_next_due_time_can_be_one_endpoints(store: WebhookBackend) -> None:
    """The sender claims per endpoint: an older backlog of one endpoint never stands before
    another endpoint's rows."""
    store.add([row(f"evt_{i}", "http://slow/", at=100.0 + i) for i in range(5)])
    store.add([row("evt_9", "http://fast/", at=200.0)])
    got = store.claim_due(300.0, "a", "tok", 60, 2, endpoint="http://fast/")
    assert [(r.id, r.endpoint) for r in got] == [("evt_9", "http://fast/")]
    slow = store.claim_due(300.0, "a", "tok", 60, 2, endpoint="http://slow/")
    assert [r.id for r in slow] == ["evt_0", "evt_1"]
    assert store.next_due_at("http://fast/") == 360.0  # its one row is under the claim
    assert store.next_due_at("http://slow/") == 102.0  # evt_2 is due already
    assert store.next_due_at("http://nobody/") is None


def test_endpoint_stats_count_what_each_endpoint_is_owed(store: WebhookBackend) -> None:
    assert store.endpoint_stats() == []
    store.add([row(f"evt_{i}", "http://a/", at=100.0 + i) for i in range(3)])
    store.add([row("evt_0", "http://b/", at=100.0)])
    claimed = store.claim_due(200.0, "a", "tok", 60, 10, endpoint="http://a/")
    store.settle(attempt(claimed[0], 201.0, "delivered", 200), "tok", Settlement(DELIVERED))
    store.settle(attempt(claimed[1], 201.0, "dropped", 410), "tok", Settlement(DROPPED))
    stats = {s.endpoint: s for s in store.endpoint_stats()}
    a, b = stats["http://a/"], stats["http://b/"]
    assert (a.owed, a.delivered, a.failed, a.oldest_owed_at) == (1, 1, 1, 102.0)
    assert (b.owed, b.delivered, b.failed, b.oldest_owed_at) == (1, 0, 0, 100.0)
    assert [s.endpoint for s in store.endpoint_stats()] == ["http://a/", "http://b/"]
