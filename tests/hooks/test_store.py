"""The inbound-event store behaves the same on every backend: an event is stored once per
``(hook, webhook-id)`` whoever posts it again, the lookback reads a hook's events in arrival
order, and a hook's secrets rotate with overlap."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import storage
from delivery.inbound_backend import HookBackend, HookEvent

KINDS = ["sqlite", "memory", "postgres"]


def open_store(kind: str, directory: Path) -> HookBackend:
    if kind == "sqlite":
        return storage.sqlite_files(ledger=directory / "ledger.db").open_hooks()
    if kind == "memory":
        return storage.open_storage("memory://").open_hooks()
    from tests.pg_support import fresh_url

    return storage.open_storage(fresh_url()).open_hooks()


@pytest.fixture(params=KINDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[HookBackend]:
    backend = open_store(str(request.param), tmp_path)
    yield backend
    backend.close()


def test_an_event_is_stored_once_per_webhook_id(store: HookBackend) -> None:
    first = HookEvent("ci", "msg_1", 100.0, '{"build": 42}')
    assert store.record_event(first) is None
    again = HookEvent("ci", "msg_1", 105.0, '{"build": 43}')
    assert store.record_event(again) == first  # the first one stands; nothing new written
    # The same id on another hook is another event.
    assert store.record_event(HookEvent("deploy", "msg_1", 101.0, "{}")) is None
    assert store.events_since("ci", 0, 10) == [first]


def test_lookback_reads_a_hooks_events_oldest_first_within_the_window(
    store: HookBackend,
) -> None:
    for i in range(5):
        store.record_event(HookEvent("ci", f"m{i}", 100.0 + i, f'{{"n": {i}}}'))
    store.record_event(HookEvent("other", "x", 103.5, "{}"))
    got = store.events_since("ci", 102.0, 10)
    assert [e.webhook_id for e in got] == ["m2", "m3", "m4"]
    assert [e.webhook_id for e in store.events_since("ci", 0, 2)] == ["m3", "m4"]  # newest 2
    assert [(e.hook, e.webhook_id) for e in store.last_events()] == [("ci", "m4"), ("other", "x")]


def test_secrets_rotate_with_overlap_per_hook(store: HookBackend) -> None:
    assert store.secrets("ci", 0) == []
    store.rotate_secret("ci", "whsec_old", 100.0, 3600)
    store.rotate_secret("deploy", "whsec_deploy", 100.0, 3600)
    store.rotate_secret("ci", "whsec_new", 200.0, 3600)
    assert [s.secret for s in store.secrets("ci", 201.0)] == ["whsec_new", "whsec_old"]
    assert [s.secret for s in store.secrets("ci", 200.0 + 3601)] == ["whsec_new"]
    assert [s.secret for s in store.secrets("deploy", 9999.0)] == ["whsec_deploy"]
    assert store.hooks_with_secrets(201.0) == ["ci", "deploy"]


def test_awkward_bodies_are_stored_as_they_came(store: HookBackend) -> None:
    body = '{"s": "\\ud800 lone", "n": ' + "9" * 500 + ', "deep": ' + "[" * 50 + "]" * 50 + "}"
    store.record_event(HookEvent("ci", "odd", 1.0, body))
    assert store.events_since("ci", 0, 1)[0].body == body


def test_retention_forgets_old_events_in_batches(store: HookBackend) -> None:
    from delivery.retention import RetentionPolicy, RetentionStores, run_retention
    from tests.stores import memory_ledger

    day = 86400.0
    now = 100 * day
    for i in range(5):
        store.record_event(HookEvent("ci", f"old{i}", now - 40 * day + i, "{}"))
    store.record_event(HookEvent("ci", "new", now - day, "{}"))
    assert store.prune_events(now - 30 * day, 10, dry_run=True) == 5
    ledger = memory_ledger()
    try:
        stores = RetentionStores(ledger=ledger, hooks=store)
        report = run_retention(stores, RetentionPolicy(batch=2), now=now)
    finally:
        ledger.close()
    [kind] = [k for k in report.kinds if k.kind == "hook_events"]
    assert kind.count == 5
    assert [e.webhook_id for e in store.events_since("ci", 0, 10)] == ["new"]
    # Forgotten, a re-post is new again (why they are kept for weeks).
    assert store.record_event(HookEvent("ci", "old0", now, "{}")) is None
