"""The rules of inbound events over every backend: an event is routed once however often it
is posted; a ``wake_when`` wait fires exactly once, matched or expired, whether its event
came before the wait was set (the lookback) or after (at arrival)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

import storage
from delivery import inbound
from delivery.inbound import HookRoute, Receipt, WaitMatch, WaitOrigin, receive, set_wait
from delivery.inbound_backend import HookEvent
from delivery.ledger import Ledger
from tests.delivery._support import FakeClock
from tests.hooks.conftest import Stores

ORIGIN = WaitOrigin(session_key="api:s1", origin_session_id="s1")


def post(s: Stores, webhook_id: str, body: object, route: HookRoute | None = None) -> Receipt:
    event = HookEvent("ci", webhook_id, s.clock(), json.dumps(body))
    return receive(s.hooks, s.ledger, route or HookRoute("ci"), event)


def wait(s: Stores, match: WaitMatch, *, lifetime: float = 3600, lookback: float = 600) -> str:
    row_id, _ = set_wait(
        s.hooks,
        s.ledger,
        hook="ci",
        match=match,
        note="tell the user build 42 is green",
        lifetime_seconds=lifetime,
        lookback_seconds=lookback,
        origin=ORIGIN,
    )
    return row_id


def offered(s: Stores) -> list[dict[str, object]]:
    """Everything due now, claimed and delivered (what a surface would do with it)."""
    delivered = []
    for event in s.ledger.take_due():
        token = s.ledger.claim(str(event["delivery_id"]), "surface")
        if token is not None and s.ledger.complete(str(event["delivery_id"]), token):
            delivered.append(event)
    return delivered


def test_an_event_routed_to_a_conversation_is_one_wake_up_however_often_posted(
    stores: Stores,
) -> None:
    s = stores
    route = HookRoute("ci", session="s1")
    first = post(s, "msg_1", {"build": 42}, route)
    again = post(s, "msg_1", {"build": 42}, route)
    assert not first.duplicate and again.duplicate and first.routed == again.routed
    due = offered(s)
    assert [e["delivery_id"] for e in due] == [first.routed]
    assert due[0]["type"] == "inbound_event" and due[0]["origin_session_id"] == "s1"
    assert json.loads(str(due[0]["payload"])) == {"build": 42}


def test_a_wait_set_before_its_event_fires_on_arrival_once(stores: Stores) -> None:
    s = stores
    row_id = wait(s, WaitMatch(path="build.status", equals="green"))
    assert post(s, "m1", {"build": {"status": "red"}}).fired == ()
    s.clock.advance(5)
    assert post(s, "m2", {"build": {"status": "green"}}).fired == (row_id,)
    assert post(s, "m3", {"build": {"status": "green"}}).fired == ()  # never twice
    due = offered(s)
    assert [(e["delivery_id"], e["outcome"], e["webhook_id"]) for e in due] == [
        (row_id, "matched", "m2")
    ]
    s.clock.advance(7200)  # past its lifetime: the expiry never comes after the match
    assert offered(s) == []


def test_a_wait_set_after_its_event_fires_by_looking_back(stores: Stores) -> None:
    s = stores
    post(s, "m1", {"text": "build 42 FAILED"})
    s.clock.advance(30)
    row_id, found = set_wait(
        s.hooks,
        s.ledger,
        hook="ci",
        match=WaitMatch(contains="FAILED"),
        note="n",
        lifetime_seconds=3600,
        lookback_seconds=600,
        origin=ORIGIN,
    )
    assert found is not None and found.webhook_id == "m1"
    assert post(s, "m1", {"text": "build 42 FAILED"}).fired == ()  # a re-post: still once
    assert post(s, "m2", {"text": "FAILED again"}).fired == ()
    assert [e["delivery_id"] for e in offered(s)] == [row_id]


def test_the_lookback_window_bounds_what_a_wait_sees(stores: Stores) -> None:
    s = stores
    post(s, "old", {"text": "FAILED"})
    s.clock.advance(3600)
    wait(s, WaitMatch(contains="FAILED"), lookback=600)
    assert offered(s) == []


def test_a_wait_with_no_match_expires_visibly(stores: Stores) -> None:
    s = stores
    row_id = wait(s, WaitMatch(path="build", equals=42), lifetime=60)
    post(s, "m1", {"build": 41})
    assert offered(s) == []
    s.clock.advance(61)
    due = offered(s)
    assert [(e["delivery_id"], e["outcome"], e["status"]) for e in due] == [
        (row_id, "expired", "expired")
    ]
    s.clock.advance(1)
    assert post(s, "m2", {"build": 42}).fired == ()  # too late: it told the conversation


def test_matches() -> None:
    body = json.dumps({"a": {"b": [1, {"c": True}]}, "n": 10**40, "s": "x\ud800y"})
    assert WaitMatch(path="a.b.1.c", equals=True).holds(body)
    assert not WaitMatch(path="a.b.0", equals=True).holds(body)  # 1 is not True
    assert WaitMatch(path="n", equals=10**40).holds(body)
    assert WaitMatch(path="a.b.9").holds(body) is False
    assert WaitMatch(contains="x").holds(body)
    assert WaitMatch().holds("not json")
    assert not WaitMatch(path="a").holds("not json")
    deep = "[" * 100_000 + "]" * 100_000
    assert not WaitMatch(path="0").holds(deep)


def test_an_event_stamped_before_a_wait_but_stored_after_its_lookback_still_fires_it(
    stores: Stores,
) -> None:
    """The interleaving the race test may not hit: the event is stamped, the wait is set and
    looks back (finding nothing yet), then the event is stored: its arrival fires the wait."""
    s = stores
    stamped = s.clock()
    s.clock.advance(1)
    row_id = wait(s, WaitMatch(contains="FAILED"))
    late = HookEvent("ci", "m1", stamped, '{"text": "FAILED"}')
    assert receive(s.hooks, s.ledger, HookRoute("ci"), late).fired == (row_id,)


def test_the_same_event_posted_to_two_servers_at_once_is_stored_and_routed_once(
    stores: Stores,
) -> None:
    import threading

    s = stores
    route = HookRoute("ci", session="s1")
    event = HookEvent("ci", "msg_1", s.clock(), '{"build": 42}')
    barrier = threading.Barrier(4)
    receipts = []

    def post_it() -> None:
        barrier.wait()
        receipts.append(receive(s.hooks, s.ledger, route, event))

    threads = [threading.Thread(target=post_it) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.duplicate for r in receipts) == [False, True, True, True]
    assert [e["delivery_id"] for e in offered(s)] == [receipts[0].routed]


def test_a_wait_is_found_by_its_hook_however_many_waits_other_hooks_hold(
    stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The open waits are read by hook in the store: waits on other hooks, newer and more
    than the read's cap, cannot push a wait on the event's hook out of it."""
    s = stores
    monkeypatch.setattr(inbound, "OPEN_WAITS_LIMIT", 3)
    row_id = wait(s, WaitMatch())
    for _ in range(5):
        set_wait(
            s.hooks,
            s.ledger,
            hook="deploys",
            match=WaitMatch(),
            note="other hook",
            lifetime_seconds=3600,
            lookback_seconds=0,
            origin=ORIGIN,
        )
    assert s.ledger.get(row_id) is not None
    assert post(s, "m1", {"build": 42}).fired == (row_id,)


def test_an_older_ledger_file_gains_the_hook_of_its_open_waits(tmp_path: Path) -> None:
    """A wait written before the ``hook`` column existed still fires once the file is
    opened by this version: the column is added and the open waits' hooks filled in."""
    path = tmp_path / "ledger.db"
    opened = storage.sqlite_files(ledger=path)
    backend, hooks, clock = opened.open_ledger(), opened.open_hooks(), FakeClock()
    s = Stores(Ledger(backend, clock=clock, monotonic=clock.monotonic), hooks, clock)
    row_id = wait(s, WaitMatch())
    hooks.close()
    backend.close()
    with sqlite3.connect(path) as conn:  # as a version-6 file had it
        conn.execute("DROP INDEX ix_pending_hook")
        conn.execute("ALTER TABLE deliveries DROP COLUMN hook")
        conn.execute("PRAGMA user_version = 6")
    conn.close()
    opened = storage.sqlite_files(ledger=path)
    backend, hooks = opened.open_ledger(), opened.open_hooks()
    try:
        s = Stores(Ledger(backend, clock=clock, monotonic=clock.monotonic), hooks, clock)
        assert post(s, "m1", {"build": 42}).fired == (row_id,)
    finally:
        hooks.close()
        backend.close()


def test_the_postgres_migration_gives_open_waits_their_hook() -> None:
    """A wait written before the migration that adds ``hook`` (its column NULL) fires after
    it: the migration fills in the hook of every open wait."""
    import psycopg

    from storage.postgres.migrations import MIGRATIONS
    from tests.pg_support import fresh_url

    url = fresh_url()
    opened = storage.open_storage(url)
    backend, hooks, clock = opened.open_ledger(), opened.open_hooks(), FakeClock()
    try:
        s = Stores(Ledger(backend, clock=clock, monotonic=clock.monotonic), hooks, clock)
        row_id = wait(s, WaitMatch())
        [adding] = [m for m in MIGRATIONS if "ADD COLUMN IF NOT EXISTS hook" in m.sql]
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("UPDATE deliveries SET hook = NULL")  # as the rows were before it
            conn.execute(adding.sql)
        assert post(s, "m1", {"build": 42}).fired == (row_id,)
    finally:
        hooks.close()
        backend.close()
