"""Conformance tests of the delivery ledger: every test runs over every backend.

The ``backend`` fixture (conftest.py) is parametrized over the backends; tests of the
SQLite file itself live in ``test_sqlite_backend.py``.

Time moves through a fake clock (``Ledger(..., clock=...)``), never by sleeping, except in
the re-offer scheduler tests at the end, which check real wake-up times.
"""

from __future__ import annotations

import dataclasses
import logging
import select
import threading
import time
from typing import Any

import pytest

from delivery import ledger_recovery, reoffer
from delivery.backend import AtMost, Below, Increment, IsSet, LedgerBackend
from delivery.errors import (
    ClaimMismatchError,
    DuplicateDeliveryError,
    InvalidTransitionError,
    LedgerUnavailable,
    UnknownDeliveryError,
)
from delivery.identity import (
    ProcessIdentity,
    current_identity,
    holder_is_dead,
    process_start_ticks,
)
from delivery.ledger import Ledger
from delivery.policy import DeliveryPolicy
from delivery.reoffer import ReofferScheduler
from delivery.rows import LedgerRow, RowQuery
from delivery.states import TERMINAL_STATES, State, can_transition
from tests.delivery._support import (
    REMOTE_IDENTITY,
    FakeClock,
    delegation_event,
    exited_identity,
    finished_row,
    identity_of,
    start_idle_child,
)

LEASE = 300.0
HOURS_48 = 48 * 3600.0


def snapshot(ledger: Ledger, row_id: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """Everything a write could have touched for one row: the row and its audit trail."""
    return ledger.get(row_id), ledger.history(row_id)


def _request(row_id: str) -> dict[str, Any]:
    """The request a dispatch stores with its row (what tools.async_delegation writes)."""
    return {"type": "async_delegation", "delegation_id": row_id, "goal": f"goal of {row_id}"}


def release_to(ledger: Ledger, clock: FakeClock, row_id: str, *, retryable: bool) -> str:
    """Wait out any backoff, claim, release; returns the state after the release."""
    row = ledger.get(row_id)
    assert row is not None
    clock.set(max(clock(), row.next_attempt_at))
    token = ledger.claim(row_id, "consumer")
    assert token, f"{row_id} should be claimable at {clock()}: {row}"
    return ledger.release(row_id, token, retryable=retryable)


# -- claim / complete / release ---------------------------------------------------------------


class TestClaimCompleteRelease:
    def test_new_row_is_pending_without_event_and_cannot_be_claimed(self, ledger: Ledger) -> None:
        row = ledger.create("r1", kind="delegation", session_key="s")
        assert row["state"] == "queued" and row["delivery_state"] == "pending"
        stored = ledger.get("r1")
        assert stored is not None
        assert stored.event is None and stored.owner == ledger.identity
        assert ledger.claim("r1", "c") is None  # nothing to deliver yet
        assert ledger.get("r1").delivery_attempts == 0  # type: ignore[union-attr]

    def test_claim_counts_an_attempt_and_takes_a_300s_lease(
        self, ledger: Ledger, clock: FakeClock
    ) -> None:
        finished_row(ledger, "r1")
        token = ledger.claim("r1", "webui")
        assert isinstance(token, str) and token
        row = ledger.get("r1")
        assert row is not None
        assert row.delivery_attempts == 1
        assert row.claim_token == token and row.claim_consumer == "webui"
        assert row.claimed_at == clock()
        assert row.claim_expires_at == clock() + LEASE
        assert row.holder == ledger.identity

    def test_second_claim_during_live_lease_gets_none_and_counts_nothing(
        self, ledger: Ledger, backend: LedgerBackend, clock: FakeClock
    ) -> None:
        finished_row(ledger, "r1")
        other = Ledger(backend, clock=clock, identity=REMOTE_IDENTITY)
        assert ledger.claim("r1", "a")
        before = snapshot(ledger, "r1")
        assert ledger.claim("r1", "b") is None
        assert other.claim("r1", "c") is None
        assert snapshot(ledger, "r1") == before

    def test_complete_needs_the_matching_claim_and_settles_once(
        self, ledger: Ledger, clock: FakeClock
    ) -> None:
        finished_row(ledger, "r1")
        token = ledger.claim("r1", "a")
        assert token
        before = snapshot(ledger, "r1")
        with pytest.raises(ClaimMismatchError, match="nothing was written"):
            ledger.complete("r1", "0" * 32)
        assert snapshot(ledger, "r1") == before
        clock.advance(1)
        assert ledger.complete("r1", token) is True
        row = ledger.get("r1")
        assert row is not None
        assert row.delivery_state == "delivered" and row.settled_at == clock()
        # A repeated ack of the same claim is a no-op, not a second delivery.
        clock.advance(1)
        assert ledger.complete("r1", token) is True
        assert ledger.get("r1") == row
        # Nobody can claim a delivered row again, at any time.
        clock.advance(10 * HOURS_48)
        assert ledger.claim("r1", "b") is None
        assert ledger.restore() == []
        assert ledger.take_due() == []
        assert ledger.get("r1").delivery_state == "delivered"  # type: ignore[union-attr]

    def test_release_returns_row_to_pending_with_backoff(
        self, ledger: Ledger, clock: FakeClock
    ) -> None:
        finished_row(ledger, "r1")
        token = ledger.claim("r1", "a")
        assert token
        assert ledger.release("r1", token) == "pending"
        row = ledger.get("r1")
        assert row is not None
        assert row.claim_token is None and row.claim_expires_at == 0
        assert row.delivery_attempts == 1  # an ordinary release keeps the attempt
        assert row.next_attempt_at == clock() + 2.0
        # During the backoff a claim is a wait, not an attempt.
        assert ledger.claim("r1", "b") is None
        assert ledger.get("r1").delivery_attempts == 1  # type: ignore[union-attr]
        clock.advance(2.0)
        assert ledger.claim("r1", "b")
        assert ledger.get("r1").delivery_attempts == 2  # type: ignore[union-attr]
        # The released claim's token is void.
        with pytest.raises(ClaimMismatchError):
            ledger.complete("r1", token)

    def test_lease_expiry_after_300s_lets_another_consumer_claim(
        self, ledger: Ledger, backend: LedgerBackend, clock: FakeClock
    ) -> None:
        finished_row(ledger, "r1")
        remote = Ledger(backend, clock=clock, identity=REMOTE_IDENTITY)
        stale = remote.claim("r1", "slow")
        assert stale
        clock.advance(LEASE - 0.001)
        assert ledger.claim("r1", "fast") is None
        clock.advance(0.001)
        fresh = ledger.claim("r1", "fast")
        assert fresh and fresh != stale
        assert ledger.get("r1").delivery_attempts == 2  # type: ignore[union-attr]
        # The expired holder can no longer acknowledge or release.
        before = snapshot(ledger, "r1")
        with pytest.raises(ClaimMismatchError):
            remote.complete("r1", stale)
        with pytest.raises(ClaimMismatchError):
            remote.release("r1", stale)
        assert snapshot(ledger, "r1") == before
        assert ledger.complete("r1", fresh)

    @pytest.mark.parametrize("reap", [True, False], ids=["reaped", "zombie"])
    def test_claim_of_a_dead_holder_is_broken_at_once(
        self, ledger: Ledger, backend: LedgerBackend, clock: FakeClock, reap: bool
    ) -> None:
        finished_row(ledger, "r1")
        child = start_idle_child()
        try:
            ident = identity_of(child.pid)
            holder = Ledger(backend, clock=clock, identity=str(ident))
            token = holder.claim("r1", "child")
            assert token
            assert ledger.get("r1").holder == str(ident)  # type: ignore[union-attr]
            # While the holder lives, its lease protects the claim.
            assert ledger.claim("r1", "me") is None
            assert child.stdin is not None
            child.stdin.close()
            if reap:
                child.wait(timeout=10)
            else:
                deadline = time.monotonic() + 10
                while process_start_ticks(child.pid) is not None:
                    assert time.monotonic() < deadline, "child did not exit"
                    time.sleep(0.005)
            # No clock movement: the lease has 300 s left, yet the claim is broken now.
            mine = ledger.claim("r1", "me")
            assert mine
            row = ledger.get("r1")
            assert row is not None
            assert row.claim_token == mine and row.delivery_attempts == 2
            with pytest.raises(ClaimMismatchError):
                holder.complete("r1", token)
        finally:
            child.kill()
            child.wait(timeout=10)

    def test_holder_identity_detects_pid_reuse(self) -> None:
        me = current_identity()
        assert not me.is_known_dead()
        recycled = ProcessIdentity(me.host, me.boot_id, me.pid, me.start_ticks + 1)
        assert recycled.is_known_dead()
        assert ProcessIdentity.parse(str(me)) == me
        assert ProcessIdentity.parse("garbage") is None
        assert not holder_is_dead(None) and not holder_is_dead("") and not holder_is_dead("x")
        assert not holder_is_dead(REMOTE_IDENTITY)  # another host: only the lease decides
        assert holder_is_dead(exited_identity())


# -- the attempt budget, refunds and backoff --------------------------------------------------


class TestBudget:
    def test_twenty_retryable_releases_leave_attempts_unchanged_and_backoff_grows(
        self, ledger: Ledger, clock: FakeClock
    ) -> None:
        finished_row(ledger, "r1")
        delays = []
        for i in range(20):
            before_attempts = ledger.get("r1").delivery_attempts  # type: ignore[union-attr]
            assert release_to(ledger, clock, "r1", retryable=True) == "pending"
            row = ledger.get("r1")
            assert row is not None
            assert row.delivery_attempts == before_attempts == 0
            assert row.refunds == i + 1
            delays.append(row.next_attempt_at - clock())
            # Never hot: claiming before the next-eligible time gets nothing and counts nothing.
            assert ledger.claim("r1", "eager") is None
            assert ledger.get("r1").delivery_attempts == 0  # type: ignore[union-attr]
        assert all(d > 0 for d in delays)
        assert delays == sorted(delays), delays  # the wait grows ...
        assert delays[-1] > delays[0]
        assert max(delays) <= DeliveryPolicy().retry_max_seconds  # ... up to its cap
        assert delays[:4] == [2.0, 4.0, 8.0, 16.0]
        assert ledger.get("r1").delivery_state == "pending"  # type: ignore[union-attr]
        assert release_to(ledger, clock, "r1", retryable=False) == "pending"
        assert ledger.get("r1").delivery_attempts == 1  # type: ignore[union-attr]

    def test_eight_ordinary_releases_drop_the_row(self, ledger: Ledger, clock: FakeClock) -> None:
        event = finished_row(ledger, "r1")
        for i in range(1, 8):
            assert release_to(ledger, clock, "r1", retryable=False) == "pending"
            assert ledger.get("r1").delivery_attempts == i  # type: ignore[union-attr]
        assert release_to(ledger, clock, "r1", retryable=False) == "dropped"
        row = ledger.get("r1")
        assert row is not None
        assert row.delivery_state == "dropped" and row.delivery_attempts == 8
        assert "budget" in row.settled_reason
        assert row.event == event  # the result of a dropped row stays queryable
        assert [h["action"] for h in ledger.history("r1")] == ["drop"]
        clock.advance(HOURS_48 / 2)
        assert ledger.claim("r1", "late") is None
        assert ledger.restore() == [] and ledger.take_due() == []
        assert ledger.get("r1").delivery_state == "dropped"  # type: ignore[union-attr]

    def test_expired_leases_spend_the_budget_too_and_never_exceed_it(
        self, ledger: Ledger, clock: FakeClock
    ) -> None:
        finished_row(ledger, "r1")
        for i in range(1, 9):
            assert ledger.claim("r1", f"c{i}")
            assert ledger.get("r1").delivery_attempts == i  # type: ignore[union-attr]
            clock.advance(LEASE)
        assert ledger.claim("r1", "c9") is None
        row = ledger.get("r1")
        assert row is not None
        assert row.delivery_state == "dropped" and row.delivery_attempts == 8

    def test_refunded_retries_are_still_dropped_past_the_replay_cap(
        self, ledger: Ledger, clock: FakeClock
    ) -> None:
        finished_row(ledger, "r1")
        token = ledger.claim("r1", "c")
        assert token
        clock.advance(HOURS_48 + 1)
        assert ledger.release("r1", token, retryable=True) == "dropped"
        row = ledger.get("r1")
        assert row is not None
        assert row.delivery_state == "dropped" and "replay age cap" in row.settled_reason

    def test_a_clock_stepped_forward_past_the_cap_drops_no_fresh_result(
        self, ledger: Ledger, clock: FakeClock
    ) -> None:
        # Seconds-old results, then the wall clock is stepped 49 h forward (NTP fixing a bad
        # RTC, a VM resumed from a snapshot): no time passed, so nothing is too old.
        finished_row(ledger, "released")
        finished_row(ledger, "restored")
        finished_row(ledger, "due")
        token = ledger.claim("released", "c")
        assert token
        clock.advance(5)
        clock.step(49 * 3600.0)
        assert ledger.release("released", token, retryable=True) == "pending"
        offered = ledger.restore()
        assert {e["delegation_id"] for e in offered} == {"restored", "due"}
        for row_id in ("released", "restored", "due"):
            row = ledger.get(row_id)
            assert row is not None and row.delivery_state == "pending", row_id
        assert not any(h["action"] == "drop" for h in ledger.history("restored"))
        # The results are still dropped once they really are past the cap.
        clock.advance(HOURS_48 + 1)
        assert ledger.take_due() == []
        for row_id in ("released", "restored", "due"):
            row = ledger.get(row_id)
            assert row is not None and row.delivery_state == "dropped", row_id
            assert row.settled_reason == "older than the replay age cap"

    def test_a_clock_stepped_back_keeps_the_cap(self, ledger: Ledger, clock: FakeClock) -> None:
        finished_row(ledger, "r1")
        clock.step(-3600.0)  # stepped back an hour: the row looks an hour younger
        clock.advance(HOURS_48 + 3600.0 + 1)
        token = ledger.claim("r1", "c")
        assert token
        assert ledger.release("r1", token, retryable=True) == "dropped"

    def test_ordinary_release_is_not_refunded(self, ledger: Ledger, clock: FakeClock) -> None:
        finished_row(ledger, "r1")
        assert release_to(ledger, clock, "r1", retryable=False) == "pending"
        assert release_to(ledger, clock, "r1", retryable=True) == "pending"
        row = ledger.get("r1")
        assert row is not None
        assert (row.delivery_attempts, row.refunds) == (1, 1)

    def test_policy_validation_and_growing_delay(self) -> None:
        for bad in (
            {"lease_seconds": 0},
            {"max_attempts": 0},
            {"replay_cap_seconds": -1},
            {"retry_base_seconds": 10, "retry_max_seconds": 5},
            {"retry_base_seconds": -1},
        ):
            with pytest.raises(ValueError):
                DeliveryPolicy(**bad)  # type: ignore[arg-type]
        p = DeliveryPolicy()
        assert (p.lease_seconds, p.max_attempts, p.replay_cap_seconds) == (300, 8, HOURS_48)
        delays = [p.retry_delay(n) for n in range(1, 200)]
        assert delays == sorted(delays) and delays[-1] == p.retry_max_seconds


# -- drop, redeliver, restore, recovery -------------------------------------------------------


class TestSettleAndRestore:
    def test_drop_settles_and_only_redeliver_brings_it_back(
        self, ledger: Ledger, clock: FakeClock
    ) -> None:
        event = finished_row(ledger, "r1")
        token = ledger.claim("r1", "c")
        assert token
        before = snapshot(ledger, "r1")
        with pytest.raises(ClaimMismatchError):
            ledger.drop("r1", "session deleted", token="f" * 32)
        assert snapshot(ledger, "r1") == before
        assert ledger.drop("r1", "session deleted", token=token) is True
        assert ledger.drop("r1", "again") is False
        row = ledger.get("r1")
        assert row is not None
        assert row.delivery_state == "dropped" and row.settled_reason == "session deleted"
        assert row.event == event
        # The holder's claim cannot deliver a dropped row.
        assert ledger.complete("r1", token) is False
        assert ledger.get("r1").delivery_state == "dropped"  # type: ignore[union-attr]
        clock.advance(LEASE * 3)
        assert ledger.claim("r1", "c") is None and ledger.restore() == []

    def test_redeliver_gives_a_fresh_budget_and_is_recorded(
        self, ledger: Ledger, clock: FakeClock
    ) -> None:
        finished_row(ledger, "r1")
        for _ in range(8):
            release_to(ledger, clock, "r1", retryable=False)
        assert ledger.get("r1").delivery_state == "dropped"  # type: ignore[union-attr]
        clock.advance(HOURS_48 * 3)  # even long after: the operator asked for it
        row = ledger.redeliver("r1", actor="alice")
        assert row.delivery_state == "pending" and row.delivery_attempts == 0
        stored = ledger.get("r1")
        assert stored is not None
        assert stored.delivery_state == "pending" and stored.delivery_attempts == 0
        assert stored.refunds == 0 and stored.settled_reason is None
        history = ledger.history("r1")
        assert [h["action"] for h in history] == ["drop", "redeliver"]
        assert "alice" in history[-1]["detail"] and history[-1]["at"] == clock()
        # It is due now and restore does not drop it as too old.
        offered = ledger.take_due()
        assert [e["delegation_id"] for e in offered] == ["r1"]
        token = ledger.claim("r1", "c")
        assert token and ledger.complete("r1", token)
        with pytest.raises(InvalidTransitionError, match="only a dropped row"):
            ledger.redeliver("r1")

    def test_redeliver_refuses_pending_rows_and_rows_without_event(self, ledger: Ledger) -> None:
        finished_row(ledger, "r1")
        with pytest.raises(InvalidTransitionError):
            ledger.redeliver("r1")
        ledger.create("r2", kind="delegation")
        assert ledger.drop("r2", "session gone")
        with pytest.raises(InvalidTransitionError, match="no completion event"):
            ledger.redeliver("r2")

    def test_restore_is_oldest_first_and_marks_the_events(
        self, ledger: Ledger, clock: FakeClock
    ) -> None:
        for row_id in ("c-newest", "a-middle", "b-oldest"):
            ledger.create(row_id, kind="delegation", state="running")
        for row_id in ("b-oldest", "a-middle", "c-newest"):
            clock.advance(5)
            ledger.finish(
                row_id, expected="running", state="completed", event=delegation_event(row_id)
            )
        finished_row(ledger, "delivered")
        token = ledger.claim("delivered", "c")
        assert token and ledger.complete("delivered", token)
        clock.advance(3600)
        offered = ledger.restore()
        assert [e["delegation_id"] for e in offered] == ["b-oldest", "a-middle", "c-newest"]
        for event in offered:
            assert event["_restored"] is True and event["_reoffer_reason"] == "restore"
            assert event["_reoffered_at"] == clock()
            assert event["summary"] == f"result of {event['delegation_id']}"
            row = ledger.get(event["delegation_id"])
            assert row is not None and row.restored == 1
            assert "_restored" not in row.event  # the stored event stays as written
            assert event["_first_offer"] is True  # nobody took it before the restart
            assert ledger.claim(event["delegation_id"], "after-restart")

    def test_restore_drops_rows_older_than_48h_instead_of_replaying(
        self, ledger: Ledger, clock: FakeClock
    ) -> None:
        finished_row(ledger, "ancient")
        clock.advance(HOURS_48 - 60)
        finished_row(ledger, "recent")
        clock.advance(61)  # "ancient" is now 48 h + 1 s old, "recent" is 61 s old
        offered = ledger.restore()
        assert [e["delegation_id"] for e in offered] == ["recent"]
        row = ledger.get("ancient")
        assert row is not None
        assert row.delivery_state == "dropped"
        assert row.settled_reason == "older than the replay age cap"
        assert row.event["summary"] == "result of ancient"
        assert any("restore" in h["detail"] for h in ledger.history("ancient"))
        assert ledger.claim("ancient", "c") is None

    def test_restore_leaves_live_claims_alone_and_voids_expired_ones(
        self, ledger: Ledger, backend: LedgerBackend, clock: FakeClock
    ) -> None:
        finished_row(ledger, "mine")
        finished_row(ledger, "remote")
        mine = ledger.claim("mine", "c")
        remote_ledger = Ledger(backend, clock=clock, identity=REMOTE_IDENTITY)
        theirs = remote_ledger.claim("remote", "c")
        assert mine and theirs
        assert ledger.restore() == []  # both are in flight under live leases
        clock.advance(LEASE)
        offered = ledger.restore()
        assert sorted(e["delegation_id"] for e in offered) == ["mine", "remote"]
        for row_id, token, who in (("mine", mine, ledger), ("remote", theirs, remote_ledger)):
            row = ledger.get(row_id)
            assert row is not None and row.claim_token is None
            with pytest.raises(ClaimMismatchError):
                who.complete(row_id, token)

    def test_take_due_reoffers_when_the_lease_runs_out(
        self, ledger: Ledger, clock: FakeClock
    ) -> None:
        finished_row(ledger, "r1")
        assert ledger.take_due() == []  # just finished: the in-process consumer has it
        clock.advance(LEASE)
        offered = ledger.take_due()
        assert [e["delegation_id"] for e in offered] == ["r1"]
        assert offered[0]["_reoffer_reason"] == "orphan"
        assert ledger.take_due() == []  # offered once per due time, not in a hot loop
        assert ledger.claim("r1", "c")
        clock.advance(LEASE)  # taken, never settled: offered again, and now it is "again"
        (again,) = ledger.take_due()
        assert "_first_offer" not in again and again["_restored"] is True

    def test_a_claim_outliving_its_offers_due_time_is_offered_again_at_its_lease_end(
        self, ledger: Ledger, clock: FakeClock
    ) -> None:
        finished_row(ledger, "r1")  # due a lease from now: the in-process consumer has it
        offered_due = ledger.get("r1").due_at  # type: ignore[union-attr]
        clock.advance(10)
        assert ledger.claim("r1", "c")
        row = ledger.get("r1")
        assert row is not None
        # The claim left the due time as it was (an in-place update on PostgreSQL) ...
        assert row.due_at == offered_due and row.claim_expires_at == clock() + LEASE
        clock.set(offered_due)
        # ... so the row is found due under a live claim: not offered, and due again at the
        # lease's end, not at once (the scheduler would loop hot on a due time in the past).
        assert ledger.take_due() == []
        assert ledger.next_due_at() == row.claim_expires_at
        assert ledger.take_due() == []
        clock.set(row.claim_expires_at)
        assert [e["delegation_id"] for e in ledger.take_due()] == ["r1"]

    def test_release_notifies_the_due_listener(self, ledger: Ledger, clock: FakeClock) -> None:
        finished_row(ledger, "r1")
        seen: list[float] = []
        ledger.add_due_listener(seen.append)
        token = ledger.claim("r1", "c")
        assert token
        ledger.release("r1", token)
        assert seen == [ledger.get("r1").next_attempt_at]  # type: ignore[union-attr]
        ledger.remove_due_listener(seen.append)

    def test_abandoned_owner_queued_becomes_interrupted_running_becomes_unknown(
        self, ledger: Ledger, backend: LedgerBackend, clock: FakeClock
    ) -> None:
        dead_owner = Ledger(backend, clock=clock, identity=exited_identity())
        dead_owner.create(
            "q1", kind="delegation", request={**_request("q1"), "goal": "never ran", "x": 1}
        )
        dead_owner.create("r1", kind="delegation", state="running", request=_request("r1"))
        dead_owner.create(
            "p1",
            kind="process",
            state="running",
            request={"type": "completion", "delivery_id": "p1", "command": "sleep 9"},
        )
        dead_owner.create("done", kind="delegation", state="running")
        dead_owner.finish(
            "done", expected="running", state="completed", event=delegation_event("done")
        )
        remote = Ledger(backend, clock=clock, identity=REMOTE_IDENTITY)
        remote.create("remote-q", kind="delegation")
        ledger.create("own-r", kind="delegation", state="running")
        clock.advance(42)

        recovered = {
            e.get("delegation_id") or e["delivery_id"]: e for e in ledger.recover_abandoned()
        }
        assert set(recovered) == {"q1", "r1", "p1"}
        assert recovered["p1"]["type"] == "completion" and recovered["p1"]["status"] == "unknown"
        q, r = ledger.get("q1"), ledger.get("r1")
        assert q is not None and r is not None
        assert q.state == "interrupted" and r.state == "unknown"
        assert ledger.get("p1").state == "unknown"  # type: ignore[union-attr]
        for row in (q, r):
            assert row.delivery_state == "pending" and row.event["abandoned"] is True
        assert q.event["status"] == "interrupted" and "never ran" in q.event["error"]
        assert q.event["goal"] == "never ran" and q.event["x"] == 1
        assert r.event["status"] == "unknown" and "unknown" in r.event["error"]
        assert r.event["duration_seconds"] == 42.0
        # Live owners (this process, another host) and finished rows are left alone.
        assert ledger.get("remote-q").state == "queued"  # type: ignore[union-attr]
        assert ledger.get("own-r").state == "running"  # type: ignore[union-attr]
        assert ledger.get("done").state == "completed"  # type: ignore[union-attr]
        assert ledger.recover_abandoned() == []  # once only
        # The completions that say so are delivered like any other.
        offered = {e["delegation_id"] for e in ledger.restore() if "delegation_id" in e}
        assert {"q1", "r1", "done"} <= offered

    def test_abandoned_event_always_names_its_row(
        self, ledger: Ledger, backend: LedgerBackend
    ) -> None:
        dead_owner = Ledger(backend, clock=ledger.clock, identity=exited_identity())
        dead_owner.create("r1", kind="delegation", state="running", request={"goal": "g"})
        (event,) = ledger.recover_abandoned()
        assert event["type"] == "async_delegation"
        assert event.get("delegation_id") == "r1"

    def test_restore_runs_recovery_of_abandoned_work(
        self, ledger: Ledger, backend: LedgerBackend
    ) -> None:
        dead_owner = Ledger(backend, clock=ledger.clock, identity=exited_identity())
        dead_owner.create("q1", kind="delegation", request=_request("q1"))
        offered = ledger.restore()
        assert [e["status"] for e in offered] == ["interrupted"]
        assert offered[0]["_restored"] is True

    def test_a_dead_servers_timers_not_yet_due_become_this_servers_and_wait(
        self, ledger: Ledger, backend: LedgerBackend, clock: FakeClock
    ) -> None:
        """A server restarted with its timers (its old self is the dead holder), or the
        survivor of one that died: the timers wait for their time, held by this one, so
        that no later pass reads them again as a dead holder's."""
        dead = Ledger(backend, clock=clock, identity=exited_identity())
        due = clock() + 3600
        _schedule_timers(dead, 3, due)
        assert backend.pending_holders() == [dead.identity]
        for take in (ledger.restore, ledger.take_due):
            assert take() == []  # not due: nothing offered, before or after adoption
        assert backend.pending_holders() == [ledger.identity]
        for i in range(3):
            row = ledger.get(f"tmr_{i}")
            assert row is not None
            assert (row.holder, row.due_at, row.restored) == (ledger.identity, due, 0)
        clock.advance(3600)
        offered = ledger.take_due()
        assert sorted(e["delegation_id"] for e in offered) == ["tmr_0", "tmr_1", "tmr_2"]

    def test_a_dead_servers_waiting_rows_are_taken_over_in_one_pass_however_many(
        self,
        ledger: Ledger,
        backend: LedgerBackend,
        clock: FakeClock,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """More waiting timers than a pass reads (``SCAN_LIMIT``, two here): one pass makes
        them all this server's, a statement per two, instead of two a pass."""
        monkeypatch.setattr(ledger_recovery, "_SCAN_LIMIT", 2)
        dead = Ledger(backend, clock=clock, identity=exited_identity())
        due = clock() + 3600
        _schedule_timers(dead, 5, due)
        finished_row(dead, "due-now")  # due now: offered, as before
        assert [e["delegation_id"] for e in ledger.take_due()] == ["due-now"]
        assert backend.pending_holders() == [ledger.identity]
        for i in range(5):
            row = ledger.get(f"tmr_{i}")
            assert row is not None
            assert (row.holder, row.due_at, row.restored) == (ledger.identity, due, 0)
            assert row.updated_at == clock()
        clock.advance(3600)
        offered = sorted(e["delegation_id"] for e in ledger.take_due())
        # "due-now" again too: its offer's lease ran out unclaimed
        assert offered == ["due-now"] + [f"tmr_{i}" for i in range(5)]

    def test_adopt_waiting_takes_only_the_holders_pending_results_not_yet_due(
        self, ledger: Ledger, backend: LedgerBackend, clock: FakeClock
    ) -> None:
        dead = Ledger(backend, clock=clock, identity=exited_identity())
        other = Ledger(backend, clock=clock, identity=REMOTE_IDENTITY)
        now, later = clock(), clock() + 60
        _schedule_timers(dead, 3, later)  # tmr_0..2: waiting, the dead holder's
        other.schedule("other", kind="timer", event=delegation_event("other"), not_before=later)
        finished_row(dead, "due")  # its attempt may be made now
        dead.schedule("dropped", kind="timer", event=delegation_event("dropped"), not_before=later)
        assert dead.drop("dropped", "its conversation was deleted")
        dead.create("no-result", kind="delegation", state="running")
        backend.write(  # held and waiting, but without a result to deliver
            lambda tx: tx.update(
                "no-result", {}, {"holder": dead.identity, "next_attempt_at": later}
            )
        )
        backend.write(  # due this very instant: not waiting any more
            lambda tx: tx.update("tmr_2", {}, {"next_attempt_at": now})
        )
        before = {row_id: ledger.get(row_id) for row_id in ("other", "due", "dropped", "no-result")}

        def adopt(limit: int) -> int:
            return backend.write(lambda tx: tx.adopt_waiting(dead.identity, "me", now, limit))

        assert adopt(1) == 1  # at most the limit
        assert adopt(10) == 1  # the rest of them
        assert adopt(10) == 0
        for row_id in ("tmr_0", "tmr_1"):
            row = ledger.get(row_id)
            assert row is not None and (row.holder, row.updated_at) == ("me", now)
        assert ledger.get("tmr_2").holder == dead.identity  # type: ignore[union-attr]
        assert {row_id: ledger.get(row_id) for row_id in before} == before
        assert backend.write(lambda tx: tx.adopt_waiting("nobody", "me", now, 10)) == 0

    def test_lifecycle_never_leaves_a_terminal_state(self) -> None:
        for terminal in TERMINAL_STATES:
            for target in State:
                assert not can_transition(terminal, target)
        assert can_transition("queued", "running") and can_transition("running", "completed")
        assert not can_transition("queued", "completed")  # it never ran

    def test_lifecycle_compare_and_set(self, ledger: Ledger) -> None:
        ledger.create("r1", kind="delegation")
        assert ledger.start("r1") is True
        assert ledger.start("r1") is False  # already running: the CAS finds no queued row
        event = delegation_event("r1")
        assert ledger.finish("r1", expected="running", state="completed", event=event)
        assert not ledger.finish("r1", expected="running", state="failed", event=event)
        assert ledger.get("r1").state == "completed"  # type: ignore[union-attr]
        with pytest.raises(InvalidTransitionError):
            ledger.finish("r1", expected="completed", state="failed", event=event)
        with pytest.raises(InvalidTransitionError):
            ledger.transition("r1", "running", "completed")  # terminal goes through finish()

    def test_result_of_work_dropped_while_running_stays_queryable(self, ledger: Ledger) -> None:
        ledger.create("r1", kind="delegation", state="running")
        assert ledger.drop("r1", "session deleted")
        event = delegation_event("r1")
        # False: there is nothing to deliver, so the caller must queue nothing.
        assert not ledger.finish("r1", expected="running", state="completed", event=event)
        row = ledger.get("r1")
        assert row is not None
        assert row.delivery_state == "dropped"  # not resurrected ...
        assert row.state == "completed"  # ... but the work's result is recorded
        assert row.event == event
        assert row.holder is None and row.due_at is None  # nobody re-offers it
        assert ledger.restore() == [] and ledger.take_due(now=ledger.clock() + 10**6) == []
        # A second finish finds no running row.
        assert not ledger.finish("r1", expected="running", state="failed", event=event)
        assert ledger.get("r1").state == "completed"  # type: ignore[union-attr]
        # The operator can still deliver it deliberately.
        assert ledger.redeliver("r1").delivery_state == "pending"
        assert ledger.claim("r1", "c")


# -- bad input ---------------------------------------------------------------------------------


class TestBadInput:
    @pytest.mark.parametrize("bad_id", [None, 42, b"r1", ["r1"], {"id": "r1"}])
    def test_ids_of_the_wrong_type(self, ledger: Ledger, bad_id: Any) -> None:
        calls = [
            lambda: ledger.create(bad_id, kind="delegation"),
            lambda: ledger.claim(bad_id, "c"),
            lambda: ledger.complete(bad_id, "t"),
            lambda: ledger.release(bad_id, "t"),
            lambda: ledger.drop(bad_id, "why"),
            lambda: ledger.redeliver(bad_id),
            lambda: ledger.start(bad_id),
            lambda: ledger.get(bad_id),
            lambda: ledger.history(bad_id),
            lambda: ledger.finish(bad_id, expected="running", state="completed", event={}),
        ]
        for call in calls:
            with pytest.raises(TypeError, match="must be a string"):
                call()
        assert ledger.query(RowQuery()) == []

    @pytest.mark.parametrize("bad_id", ["", "x" * 201])
    def test_ids_of_the_wrong_length(self, ledger: Ledger, bad_id: str) -> None:
        with pytest.raises(ValueError, match="1 to 200"):
            ledger.create(bad_id, kind="delegation")
        with pytest.raises(ValueError):
            ledger.claim(bad_id, "c")
        assert ledger.query(RowQuery()) == []

    def test_unknown_ids(self, ledger: Ledger) -> None:
        event = delegation_event("nope")
        calls = [
            lambda: ledger.claim("nope", "c"),
            lambda: ledger.complete("nope", "t"),
            lambda: ledger.release("nope", "t"),
            lambda: ledger.release("nope", "t", retryable=True),
            lambda: ledger.drop("nope", "why"),
            lambda: ledger.redeliver("nope"),
            lambda: ledger.start("nope"),
            lambda: ledger.finish("nope", expected="running", state="completed", event=event),
        ]
        for call in calls:
            with pytest.raises(UnknownDeliveryError, match="nope") as info:
                call()
            assert isinstance(info.value, KeyError)  # callers may treat it as a missing key
            assert str(info.value) == "no ledger row 'nope'"
        assert ledger.get("nope") is None and ledger.history("nope") == []
        assert ledger.query(RowQuery()) == []

    def test_bad_tokens_consumers_events_and_requests(self, ledger: Ledger) -> None:
        finished_row(ledger, "r1")
        before = snapshot(ledger, "r1")
        for token in (None, "", 7, b"tok"):
            with pytest.raises(TypeError, match="claim token"):
                ledger.complete("r1", token)  # type: ignore[arg-type]
            with pytest.raises(TypeError, match="claim token"):
                ledger.release("r1", token)  # type: ignore[arg-type]
        for consumer in (None, "", 3):
            with pytest.raises(TypeError, match="consumer"):
                ledger.claim("r1", consumer)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="request must be a dict"):
            ledger.create("r2", kind="delegation", request=["x"])  # type: ignore[arg-type]
        ledger.create("r3", kind="delegation", state="running")
        with pytest.raises(TypeError, match="event must be a dict"):
            ledger.finish("r3", expected="running", state="completed", event="done")  # type: ignore[arg-type]
        with pytest.raises(InvalidTransitionError):
            ledger.create("r4", kind="delegation", state="completed")
        with pytest.raises(ValueError):
            ledger.create("r5", kind="delegation", state="bogus")
        with pytest.raises(DuplicateDeliveryError):
            ledger.create("r1", kind="delegation")
        assert snapshot(ledger, "r1") == before
        assert {r.id for r in ledger.query(RowQuery())} == {"r1", "r3"}
        assert ledger.get("r3").state == "running"  # type: ignore[union-attr]

    @pytest.mark.parametrize("op", ["complete", "release", "release-retryable", "drop"])
    def test_a_claim_token_that_is_not_the_holders_writes_nothing(
        self, ledger: Ledger, clock: FakeClock, op: str
    ) -> None:
        finished_row(ledger, "r1")
        stale = ledger.claim("r1", "first")
        assert stale
        assert ledger.release("r1", stale) == "pending"
        clock.advance(10)
        current = ledger.claim("r1", "second")
        assert current
        clock.advance(1)
        for wrong in (stale, "not-a-token-at-all"):
            before = snapshot(ledger, "r1")
            with pytest.raises(ClaimMismatchError, match="r1"):
                if op == "complete":
                    ledger.complete("r1", wrong)
                elif op == "drop":
                    ledger.drop("r1", "x", token=wrong)
                else:
                    ledger.release("r1", wrong, retryable=op == "release-retryable")
            assert snapshot(ledger, "r1") == before
        assert ledger.complete("r1", current)


# -- the storage primitives every backend provides ----------------------------------------------


def _row(row_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": row_id,
        "kind": "delegation",
        "state": "running",
        "delivery_state": "pending",
        "created_at": 1.0,
        "updated_at": 1.0,
        **extra,
    }


class TestLedgerTx:
    def test_compare_and_set_predicates_and_increment(self, backend: LedgerBackend) -> None:
        backend.write(lambda tx: tx.insert(_row("r", due_at=5.0, request={"a": (1, 2)})))

        def cas(expect: dict[str, Any], changes: dict[str, Any] | None = None) -> bool:
            return backend.write(lambda tx: tx.update("r", expect, changes or {"updated_at": 2.0}))

        assert cas({"due_at": AtMost(5.0)}) and not cas({"due_at": AtMost(4.9)})
        assert cas({"due_at": Below(5.1)}) and not cas({"due_at": Below(5.0)})
        assert cas({"due_at": IsSet()}) and not cas({"settled_at": IsSet()})
        assert cas({"settled_at": None}) and not cas({"due_at": None})
        # NULL never compares: neither equal nor at most anything
        assert not cas({"settled_at": AtMost(1e9)}) and not cas({"settled_at": 0})
        assert not cas({"state": "queued"}) and not backend.write(
            lambda tx: tx.update("missing", {}, {"updated_at": 3.0})
        )
        assert cas({"delivery_attempts": 0}, {"delivery_attempts": Increment(2)})
        assert cas({"delivery_attempts": 2}, {"delivery_attempts": Increment(1)})
        row = backend.get("r")
        assert row is not None and row.delivery_attempts == 3 and row.claim_expires_at == 0
        assert row.request == {"a": [1, 2]}  # JSON columns come back as JSON
        assert backend.write(lambda tx: tx.get("r", ("id", "request"))) == {
            "id": "r",
            "request": {"a": [1, 2]},
        }
        with pytest.raises(ValueError, match="unknown ledger column"):
            cas({"nope": 1})

    def test_update_many_answers_each_compare_and_set_in_order(
        self, backend: LedgerBackend
    ) -> None:
        """What the re-offer of a burst of due timers sends in one trip: each update answers
        as on its own, a later one sees what an earlier one of the same call changed, and a
        miss changes nothing."""
        for row_id in ("a", "b"):
            backend.write(lambda tx, row_id=row_id: tx.insert(_row(row_id, due_at=5.0)))
        answers = backend.write(
            lambda tx: tx.update_many(
                [
                    ("a", {"due_at": AtMost(5.0)}, {"due_at": 9.0}),
                    ("a", {"due_at": 5.0}, {"state": "completed"}),  # sees the 9.0: a miss
                    ("b", {"due_at": 5.0}, {"delivery_attempts": Increment(1)}),
                    ("missing", {}, {"updated_at": 3.0}),
                    ("b", {"delivery_attempts": 1}, {"updated_at": 4.0}),
                ]
            )
        )
        assert answers == [True, False, True, False, True]
        a, b = backend.get("a"), backend.get("b")
        assert a is not None and a.due_at == 9.0 and a.state == "running"
        assert b is not None and b.delivery_attempts == 1 and b.updated_at == 4.0
        assert backend.write(lambda tx: tx.update_many([])) == []

    def test_update_many_of_distinct_rows_answers_as_each_update_alone(
        self, backend: LedgerBackend
    ) -> None:
        """A re-offer pass's shape: many distinct rows, a few shapes of compare-and-set
        (PostgreSQL sends each shape as one statement). Every row must end exactly as the
        same update alone leaves its twin, and answer the same."""
        rows = [
            {"holder": None, "due_at": 5.0},
            {"holder": "h1", "due_at": 5.0, "claim_token": "t1", "claim_expires_at": 4.5},
            {"holder": "h1", "due_at": 6.0},  # its due time moved: a miss
            {"holder": None, "due_at": 5.0, "delivery_state": "delivered"},  # settled: a miss
            {"holder": "h2", "due_at": 5.0, "delivery_attempts": 2},
            {"holder": None, "due_at": 5.0, "delivery_attempts": 3},  # at the budget: a miss
        ]

        def updates(prefix: str) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
            out: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
            for i, row in enumerate(rows):
                expect = {
                    "delivery_state": "pending",
                    "holder": row["holder"],
                    "due_at": 5.0,
                    "claim_token": row.get("claim_token"),
                    "delivery_attempts": Below(3),
                    "claim_expires_at": AtMost(4.5),
                }
                if i % 2:
                    expect["created_at"] = IsSet()
                changes: dict[str, Any] = {
                    "holder": "me",
                    "due_at": 9.0 + i,
                    "restored": Increment(1),
                    "updated_at": 2.0,
                    "event": {"n": i, "text": 'it\'s "quoted"'},
                }
                if row.get("claim_token"):
                    changes.update(claim_token=None, claim_consumer=None, claim_expires_at=0)
                out.append((f"{prefix}{i}", expect, changes))
            out.append((f"{prefix}missing", {"delivery_state": "pending"}, {"updated_at": 3.0}))
            return out

        for prefix in ("many", "one"):
            for i, row in enumerate(rows):
                new = _row(f"{prefix}{i}", **row)
                backend.write(lambda tx, new=new: tx.insert(new))
        batched = backend.write(lambda tx: tx.update_many(updates("many")))
        alone = [backend.write(lambda tx, u=u: tx.update(*u)) for u in updates("one")]
        assert batched == alone == [True, True, False, False, True, False, False]
        for i in range(len(rows)):
            many, one = backend.get(f"many{i}"), backend.get(f"one{i}")
            assert many is not None and one is not None
            assert dataclasses.replace(many, id="") == dataclasses.replace(one, id="")

    def test_an_operation_that_raises_changes_nothing(self, backend: LedgerBackend) -> None:
        backend.write(lambda tx: tx.insert(_row("r")))

        def bad(tx: Any) -> None:
            tx.insert(_row("other"))
            tx.update("r", {}, {"state": "completed", "delivery_attempts": Increment(1)})
            tx.audit("r", "drop", "half-done", 2.0)
            raise RuntimeError("boom")

        with pytest.raises(RuntimeError, match="boom"):
            backend.write(bad)
        fut = backend.submit(bad)
        with pytest.raises(RuntimeError, match="boom"):
            fut.result()
        row = backend.get("r")
        assert row is not None and row.state == "running" and row.delivery_attempts == 0
        assert backend.get("other") is None and backend.audit_log("r") == []
        with pytest.raises(DuplicateDeliveryError):
            backend.write(lambda tx: tx.insert(_row("r")))
        assert backend.write(lambda tx: tx.get("r", ("state",))) == {"state": "running"}

    async def test_submit_async_resolves_on_the_running_loop(self, backend: LedgerBackend) -> None:
        assert await backend.submit_async(lambda tx: tx.insert(_row("a")) or "ok") == "ok"
        with pytest.raises(DuplicateDeliveryError):
            await backend.submit_async(lambda tx: tx.insert(_row("a")))

    def test_url_and_wakeups_through_the_notifier(self, backend: LedgerBackend) -> None:
        assert backend.url.startswith(("sqlite:///", "memory://", "postgresql://"))
        sub = backend.notifier.subscribe()
        assert sub is not None
        try:
            assert backend.notifier.notify() >= 1
            ready, _, _ = select.select([sub.fileno()], [], [], 5)
            assert ready
            sub.drain()
            ready, _, _ = select.select([sub.fileno()], [], [], 0)
            assert not ready
        finally:
            sub.close()

    def test_a_closed_backend_refuses_writes(self, backend: LedgerBackend) -> None:
        backend.close()
        with pytest.raises(LedgerUnavailable):
            backend.write(lambda tx: tx.insert(_row("r")))


# -- concurrency -------------------------------------------------------------------------------


class TestConcurrency:
    def test_sixteen_threads_racing_to_claim_one_row_exactly_one_wins(
        self, backend: LedgerBackend, clock: FakeClock
    ) -> None:
        n = 16
        ledgers = [Ledger(backend, clock=clock) for _ in range(n)]
        for round_ in range(20):
            row_id = f"race-{round_}"
            finished_row(ledgers[0], row_id)
            barrier = threading.Barrier(n)
            tokens: list[str | None] = [None] * n

            def claim(
                i: int, row_id: str = row_id, barrier: Any = barrier, tokens: Any = tokens
            ) -> None:
                barrier.wait()
                tokens[i] = ledgers[i].claim(row_id, f"consumer-{i}")

            threads = [threading.Thread(target=claim, args=(i,)) for i in range(n)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            winners = [t for t in tokens if t]
            assert len(winners) == 1, (round_, tokens)
            row = ledgers[0].get(row_id)
            assert row is not None
            assert row.claim_token == winners[0] and row.delivery_attempts == 1


# -- the re-offer scheduler (real time) --------------------------------------------------------


class _Offers:
    def __init__(self) -> None:
        self.items: list[tuple[float, dict[str, Any]]] = []
        self.event = threading.Event()

    def __call__(self, event: dict[str, Any]) -> None:
        self.items.append((time.time(), event))
        self.event.set()


def _count_passes(ledger: Ledger) -> list[float]:
    """Record every scheduler pass (each calls ``take_due`` once) without touching the code."""
    calls: list[float] = []
    original = ledger.take_due

    def counting(*args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        calls.append(time.time())
        return original(*args, **kwargs)

    ledger.take_due = counting  # type: ignore[method-assign]
    return calls


def _schedule_timers(ledger: Ledger, count: int, due: float) -> None:
    for i in range(count):
        ledger.schedule(
            f"tmr_{i}", kind="timer", event=delegation_event(f"tmr_{i}"), not_before=due
        )


def _offered_ids(offers: _Offers, count: int) -> list[str]:
    """The ids offered, sorted, once ``count`` were (or after 10 s)."""
    deadline = time.time() + 10
    while len(offers.items) < count and time.time() < deadline:
        time.sleep(0.02)
    return sorted(e["delegation_id"] for _, e in offers.items)


@pytest.fixture
def real_backend(backend: LedgerBackend) -> LedgerBackend:
    return backend  # the same backend, used with the real clock


class TestReofferScheduler:
    def test_released_row_is_reoffered_when_its_backoff_ends_without_polling(
        self, real_backend: LedgerBackend
    ) -> None:
        policy = DeliveryPolicy(retry_base_seconds=0.4, retry_max_seconds=0.4)
        ledger = Ledger(real_backend, policy)
        finished_row(ledger, "r1")
        offers = _Offers()
        passes = _count_passes(ledger)
        sched = ReofferScheduler(ledger, offers, max_sleep_seconds=60)
        sched.start()
        try:
            token = ledger.claim("r1", "busy-session")
            assert token
            ledger.release("r1", token, retryable=True)
            eligible = ledger.get("r1").next_attempt_at  # type: ignore[union-attr]
            assert offers.event.wait(5), "the row was never re-offered"
            offered_at, event = offers.items[0]
            assert event["delegation_id"] == "r1" and event["_reoffer_reason"] == "orphan"
            assert eligible <= offered_at < eligible + 0.25, offered_at - eligible
            assert len(passes) <= 5, f"{len(passes)} passes in 0.4 s: that is polling"
            assert ledger.claim("r1", "busy-session")
        finally:
            sched.stop()

    def test_a_burst_of_due_rows_is_offered_in_batches_in_one_pass(
        self, real_backend: LedgerBackend, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Thousands of timers due in one second: each batch is offered as soon as it is
        taken, and the pass goes on until none is left (not one batch per pass). Here
        nothing is read ahead (the next test): they are found due by ``take_due``."""
        monkeypatch.setattr(reoffer, "OFFER_BATCH", 4)
        monkeypatch.setattr(reoffer, "READ_AHEAD_SECONDS", 0.0)
        ledger = Ledger(real_backend)
        due = time.time() + 0.3
        _schedule_timers(ledger, 10, due)
        offers = _Offers()
        takes = _count_passes(ledger)
        sched = ReofferScheduler(ledger, offers, max_sleep_seconds=60)
        sched.start()
        try:
            assert _offered_ids(offers, 10) == [f"tmr_{i}" for i in range(10)]
            # 4 + 4 + 2: three takes right after one another at the due time.
            burst = [t for t in takes if t >= due]
            assert len(burst) >= 3 and burst[2] - burst[0] < 1.0
        finally:
            sched.stop()

    def test_rows_due_soon_are_read_ahead_and_offered_at_their_time(
        self, real_backend: LedgerBackend, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The scheduler wakes before a due time to read its rows, then offers them at it in
        batches, never before it, without reading them again."""
        monkeypatch.setattr(reoffer, "OFFER_BATCH", 4)
        monkeypatch.setattr(reoffer, "READ_AHEAD_SECONDS", 0.4)
        ledger = Ledger(real_backend)
        due = time.time() + 0.8  # beyond the window when the scheduler starts
        _schedule_timers(ledger, 10, due)
        reads: list[tuple[float, list[str]]] = []
        read_ahead = ledger.read_ahead

        def recording(until: float, limit: int = 10_000) -> list[LedgerRow]:
            rows = read_ahead(until, limit)
            reads.append((time.time(), [row.id for row in rows]))
            return rows

        monkeypatch.setattr(ledger, "read_ahead", recording)
        takes = _count_passes(ledger)
        offers = _Offers()
        sched = ReofferScheduler(ledger, offers, max_sleep_seconds=60)
        sched.start()
        try:
            assert _offered_ids(offers, 10) == [f"tmr_{i}" for i in range(10)]
            assert [ids for at, ids in reads if ids] == [[f"tmr_{i}" for i in range(10)]]
            (read_at,) = [at for at, ids in reads if ids]
            assert due - 0.6 < read_at < due, "read at the window's start, before the due time"
            assert all(at >= due for at, _ in offers.items), "offered before the due time"
            assert len(takes) <= 4, f"{len(takes)} passes: the read-ahead wake-up is one"
        finally:
            sched.stop()
        assert ledger.take_due(now=due + 1) == []  # each offered once, and held since

    def test_row_held_by_a_process_that_dies_is_reoffered_promptly(
        self, real_backend: LedgerBackend
    ) -> None:
        ledger = Ledger(real_backend)
        finished_row(ledger, "held")
        child = start_idle_child()
        sched = None
        try:
            child_ledger = Ledger(real_backend, identity=str(identity_of(child.pid)))
            child_token = child_ledger.claim("held", "child-consumer")
            assert child_token
            child_ledger.create("owned", kind="delegation", state="running")
            offers = _Offers()
            sched = ReofferScheduler(ledger, offers, max_sleep_seconds=60)
            sched.start()
            time.sleep(0.3)
            assert offers.items == []  # a live holder with a live lease keeps its claim
            killed_at = time.time()
            child.kill()
            deadline = time.monotonic() + 5
            while len(offers.items) < 2 and time.monotonic() < deadline:
                time.sleep(0.005)
            by_id = {e["delegation_id"]: (t, e) for t, e in offers.items if "delegation_id" in e}
            assert "held" in by_id, offers.items
            assert by_id["held"][0] - killed_at < 1.0
            # The running row the dead process owned comes back as "unknown".
            owned = ledger.get("owned")
            assert owned is not None and owned.state == "unknown"
            assert any(e.get("status") == "unknown" for _, e in offers.items)
            assert ledger.claim("held", "me")
            with pytest.raises(ClaimMismatchError):
                ledger.complete("held", child_token)
        finally:
            if sched is not None:
                sched.stop()
            child.kill()
            child.wait(timeout=10)

    def test_with_nothing_due_the_scheduler_sleeps(self, real_backend: LedgerBackend) -> None:
        ledger = Ledger(real_backend)
        finished_row(ledger, "later")  # due when its lease ends, 300 s from now
        offers = _Offers()
        passes = _count_passes(ledger)
        sched = ReofferScheduler(ledger, offers, max_sleep_seconds=60)
        sched.start()
        try:
            time.sleep(0.2)
            settled = len(passes)
            assert 1 <= settled <= 2
            time.sleep(0.8)
            assert len(passes) == settled, "the scheduler woke up with nothing due"
            assert offers.items == []
        finally:
            started = time.monotonic()
            sched.stop()
            assert time.monotonic() - started < 2  # stop wakes it at once

    def test_a_sooner_due_time_wakes_a_sleeping_scheduler(
        self, real_backend: LedgerBackend
    ) -> None:
        policy = DeliveryPolicy(lease_seconds=0.3)
        ledger = Ledger(real_backend, policy)
        offers = _Offers()
        sched = ReofferScheduler(ledger, offers, max_sleep_seconds=60)
        sched.start()
        try:
            time.sleep(0.1)  # asleep: the ledger is empty
            # Nobody claims it: due when its 0.3 s lease ends. The lease starts
            # somewhere inside finished_row, so bound the offer from both sides.
            before = time.time()
            finished_row(ledger, "r1")
            after = time.time()
            assert offers.event.wait(5)
            offered_at = offers.items[0][0]
            assert offered_at - before >= 0.29, "offered before its lease ended"
            assert offered_at - after < 0.6, "the sooner due time did not wake it"
        finally:
            sched.stop()


def test_work_recovered_from_a_dead_server_is_logged(
    ledger: Ledger, backend: LedgerBackend, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    dead = exited_identity()
    owner = Ledger(backend, clock=clock, identity=dead)
    owner.create("r1", kind="delegation", state="running", request=_request("r1"))
    owner.create("held", kind="delegation", state="running")
    owner.finish("held", expected="running", state="completed", event=delegation_event("held"))
    with caplog.at_level(logging.INFO, logger="delivery.ledger"):
        ledger.recover_abandoned()
        ledger.take_due()
    assert f"recovered delegation r1 from dead server {dead}: unknown" in caplog.text
    assert f"recovering 1 undelivered result(s) held by dead server {dead}: held" in caplog.text
    caplog.clear()
    owner.create("later", kind="delegation", state="running")
    owner.finish("later", expected="running", state="completed", event=delegation_event("later"))
    with caplog.at_level(logging.INFO, logger="delivery.ledger"):
        ledger.take_due()
    assert "held by dead server" not in caplog.text  # said once per dead server
