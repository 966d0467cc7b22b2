"""Conformance tests of completions due later (``not_before``: a timer), over every backend.

A row finished with ``not_before`` is claimable only once due, is due (``next_due_at``) at
that instant, is offered by whichever server takes it then and by one only, counts its
replay age from then, and can be cancelled until then.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from delivery.backend import LedgerBackend
from delivery.ledger import Ledger
from delivery.policy import DeliveryPolicy
from delivery.reoffer import ReofferScheduler
from storage.sqlite.ledger import SCHEMA_VERSION, SqliteBackend
from tests.delivery._support import REMOTE_IDENTITY, FakeClock, delegation_event

HOURS_48 = 48 * 3600.0


def _timer(ledger: Ledger, row_id: str, not_before: float) -> None:
    ledger.create(row_id, kind="timer", state="running", session_key="sess")
    event = delegation_event(row_id)
    assert ledger.finish(
        row_id, expected="running", state="completed", event=event, not_before=not_before
    )


def test_a_row_is_claimable_only_once_due(ledger: Ledger, clock: FakeClock) -> None:
    due = clock() + 600
    _timer(ledger, "t1", due)
    row = ledger.get("t1")
    assert row is not None and row.not_before == due and row.due_at == due
    assert ledger.claim("t1", "c") is None
    clock.advance(due - 0.001 - clock())
    assert ledger.claim("t1", "c") is None
    clock.advance(due - clock())
    token = ledger.claim("t1", "c")
    assert token and ledger.complete("t1", token)


def test_next_due_is_the_earliest_not_before(ledger: Ledger, clock: FakeClock) -> None:
    _timer(ledger, "far", clock() + 10_000)
    _timer(ledger, "near", clock() + 20)
    assert ledger.next_due_at() == clock() + 20


def test_restore_and_take_due_never_offer_before_the_due_time(
    ledger: Ledger, clock: FakeClock
) -> None:
    due = clock() + 600
    _timer(ledger, "t1", due)
    assert ledger.restore() == []
    assert ledger.take_due() == []
    clock.advance(due - clock())
    offered = ledger.take_due()
    assert [e["delegation_id"] for e in offered] == ["t1"]
    assert offered[0].get("_first_offer") is True


def test_two_servers_offer_a_due_timer_once(
    ledger: Ledger, backend: object, clock: FakeClock
) -> None:
    due = clock() + 60
    _timer(ledger, "t1", due)
    other = Ledger(ledger.backend, clock=clock, monotonic=clock.monotonic, identity=REMOTE_IDENTITY)
    clock.advance(due - clock())
    offers = ledger.take_due() + other.take_due()
    assert len(offers) == 1
    tokens = [ledger.claim("t1", "a"), other.claim("t1", "b")]
    assert sum(t is not None for t in tokens) == 1


def test_the_replay_cap_counts_from_the_due_time(ledger: Ledger, clock: FakeClock) -> None:
    due = clock() + 30 * 24 * 3600.0
    _timer(ledger, "month", due)
    clock.advance(due + 60 - clock())
    offered = ledger.take_due()
    assert [e["delegation_id"] for e in offered] == ["month"]
    row = ledger.get("month")
    assert row is not None and row.delivery_state == "pending"


def test_a_timer_past_the_cap_after_its_due_time_is_dropped(
    ledger: Ledger, clock: FakeClock
) -> None:
    due = clock() + 60
    _timer(ledger, "t1", due)
    clock.advance(due + HOURS_48 + 1 - clock())
    assert ledger.take_due() == []
    row = ledger.get("t1")
    assert row is not None and row.delivery_state == "dropped"


def test_a_timer_is_cancelled_until_due_and_never_fires(ledger: Ledger, clock: FakeClock) -> None:
    due = clock() + 600
    _timer(ledger, "t1", due)
    outcome = ledger.cancel("t1", by="operator")
    assert outcome.status == "cancelled" and outcome.event is None
    clock.advance(due + 1 - clock())
    assert ledger.take_due() == []
    assert ledger.claim("t1", "c") is None
    row = ledger.get("t1")
    assert row is not None and row.delivery_state == "dropped"
    assert "cancelled by operator" in (row.settled_reason or "")
    assert ledger.cancel("t1", by="operator").status == "already_finished"


def test_rows_read_ahead_are_offered_at_their_time_unless_changed_since(
    ledger: Ledger, clock: FakeClock
) -> None:
    """The scheduler reads the rows due within a second ahead of time (``read_ahead``) and
    offers them when due (``offer_read``): each by a compare-and-set on what was read, so a
    row another server took, a consumer claimed or an operator cancelled meanwhile is left
    as it now is."""
    due = clock() + 60
    for name in ("taken", "claimed", "cancelled", "untouched"):
        _timer(ledger, name, due)
    _timer(ledger, "later", due + 3600)
    rows = ledger.read_ahead(due + 1)
    assert [row.id for row in rows] == ["taken", "claimed", "cancelled", "untouched"]
    assert ledger.offer_read(rows) == []  # not due yet: nothing offered, nothing written
    other = Ledger(ledger.backend, clock=clock, monotonic=clock.monotonic, identity=REMOTE_IDENTITY)
    assert ledger.cancel("cancelled", by="operator").status == "cancelled"
    clock.advance(due - clock())
    assert [e["delegation_id"] for e in other.offer_read(rows[:1])] == ["taken"]
    assert ledger.claim("claimed", "c")
    offered = ledger.offer_read(rows)
    assert [e["delegation_id"] for e in offered] == ["untouched"]
    assert offered[0]["_reoffer_reason"] == "orphan" and offered[0]["_first_offer"] is True
    assert ledger.take_due() == []  # each was offered once, by one server
    untouched = ledger.get("untouched")
    assert untouched is not None and untouched.restored == 1


def test_two_servers_offering_the_same_rows_read_ahead_offer_each_once(
    ledger: Ledger, clock: FakeClock
) -> None:
    due = clock() + 60
    for i in range(6):
        _timer(ledger, f"t{i}", due)
    other = Ledger(ledger.backend, clock=clock, monotonic=clock.monotonic, identity=REMOTE_IDENTITY)
    mine, theirs = ledger.read_ahead(due), other.read_ahead(due)
    clock.advance(due - clock())
    offers = other.offer_read(theirs[3:]) + ledger.offer_read(mine) + other.offer_read(theirs)
    assert sorted(e["delegation_id"] for e in offers) == [f"t{i}" for i in range(6)]


def test_an_offered_event_is_the_consumers_own(ledger: Ledger, clock: FakeClock) -> None:
    """A consumer may change the event it was offered: the stored one stays as it was."""
    ledger.create("t1", kind="timer", state="running", session_key="sess")
    event = delegation_event("t1", result={"lines": ["a"]})
    ledger.finish("t1", expected="running", state="completed", event=event, not_before=clock())
    (offered,) = ledger.take_due()
    offered["result"]["lines"].append("changed")  # type: ignore[index, union-attr]
    row = ledger.get("t1")
    assert row is not None and row.event is not None
    assert row.event["result"] == {"lines": ["a"]}


def test_a_fired_timer_is_no_longer_cancellable(ledger: Ledger, clock: FakeClock) -> None:
    due = clock() + 5
    _timer(ledger, "t1", due)
    clock.advance(due - clock())
    assert ledger.claim("t1", "c")
    assert ledger.cancel("t1", by="operator").status == "already_finished"


def test_a_not_before_in_the_past_is_due_now(ledger: Ledger, clock: FakeClock) -> None:
    _timer(ledger, "t1", clock() - 5)
    assert ledger.claim("t1", "c")


def test_a_nearer_timer_set_by_another_server_wakes_a_sleeping_scheduler(
    backend: LedgerBackend,
) -> None:
    """Real time: the scheduler sleeps until a timer an hour away; another server (another
    ``Ledger`` on the store, so none of this one's due listeners) sets one 0.3 s away, and
    its poke through the store's notifier wakes the scheduler, which offers it on time."""
    # Heartbeats an hour apart: nothing but the poke can wake the scheduler in time.
    policy = DeliveryPolicy(peer_timeout_seconds=3600)
    ledger = Ledger(backend, policy)  # type: ignore[arg-type]
    _timer(ledger, "far", time.time() + 3600)
    offers: list[tuple[float, dict[str, Any]]] = []
    offered = threading.Event()

    def offer(event: dict[str, Any]) -> None:
        offers.append((time.time(), event))
        offered.set()

    sched = ReofferScheduler(ledger, offer, max_sleep_seconds=60)
    sched.start()
    try:
        time.sleep(0.2)  # asleep until "far" (or max_sleep)
        other = Ledger(backend, policy, identity=REMOTE_IDENTITY)  # type: ignore[arg-type]
        due = time.time() + 0.3
        other.schedule("near", kind="timer", event=delegation_event("near"), not_before=due)
        assert offered.wait(10), "the nearer timer never fired"
        at, event = offers[0]
        assert event["delegation_id"] == "near" and at >= due
        assert [e["delegation_id"] for _, e in offers] == ["near"]
    finally:
        sched.stop()


def test_an_older_sqlite_ledger_gains_not_before_on_open(tmp_path: Path) -> None:
    """A version-5 file (written before ``not_before``) is upgraded on open: its rows read
    as due at once, and a timer can be set in it."""
    path = tmp_path / "old.db"
    ledger = Ledger(SqliteBackend(path))
    ledger.create("deleg_old", kind="delegation", state="running")
    ledger.close()
    raw = sqlite3.connect(path, isolation_level=None)
    raw.executescript("ALTER TABLE deliveries DROP COLUMN not_before; PRAGMA user_version = 5;")
    raw.close()

    ledger = Ledger(SqliteBackend(path))
    try:
        old = ledger.get("deleg_old")
        assert old is not None and old.not_before is None
        row = ledger.schedule("tmr_new", kind="timer", event={"type": "x"}, not_before=1e12)
        assert ledger.get("tmr_new") == row
    finally:
        ledger.close()
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    raw.close()


def test_schedule_writes_one_row_due_later(ledger: Ledger, clock: FakeClock) -> None:
    event = delegation_event("tmr_1")
    row = ledger.schedule(
        "tmr_1", kind="timer", event=event, not_before=clock() + 60, origin_session_id="s"
    )
    assert ledger.get("tmr_1") == row
    assert row.state == "completed" and row.delivery_state == "pending"
    assert [a["action"] for a in ledger.history("tmr_1")] == ["schedule"]
    assert ledger.claim("tmr_1", "c") is None
    clock.advance(60)
    assert [e["delegation_id"] for e in ledger.take_due()] == ["tmr_1"]
