"""Liveness across hosts, and fencing, over every backend (the rules live above the seam).

A server of another host cannot be watched by pidfd: it renews a heartbeat, and once that
is older than ``peer_timeout_seconds`` the survivors treat it as dead and recover its work
as a restart would: queued work becomes interrupted, running work unknown, its claims are
broken and its pending rows offered again. A claim taken over can no longer be completed
or released by its old holder (fencing by the claim token).
"""

from __future__ import annotations

import time

import pytest

from delivery.backend import LedgerBackend
from delivery.errors import ClaimMismatchError
from delivery.ledger import Ledger
from delivery.policy import DeliveryPolicy
from delivery.reoffer import ReofferScheduler
from tests.delivery._support import REMOTE_IDENTITY, FakeClock, finished_row

POLICY = DeliveryPolicy(peer_timeout_seconds=15.0)


def test_a_remote_server_whose_heartbeat_lapses_has_its_work_recovered(
    backend: LedgerBackend, clock: FakeClock
) -> None:
    remote = Ledger(backend, POLICY, clock=clock, identity=REMOTE_IDENTITY)
    remote.servers.register("api elsewhere:8642")
    remote.create("queued-1", kind="delegation", session_key="s")
    remote.create("running-1", kind="delegation", state="running", session_key="s")
    finished_row(remote, "held-1")
    token = remote.claim("held-1", "remote-consumer")
    assert token
    survivor = Ledger(backend, POLICY, clock=clock)
    survivor.servers.register("api here:8642")

    clock.advance(10)
    remote.servers.heartbeat()  # alive: renewed in time
    clock.advance(10)  # 10 s since its last heartbeat: not lapsed
    assert survivor.recover_abandoned() == []
    assert survivor.take_due() == []
    assert survivor.servers.next_lapse_at == pytest.approx(clock() + 5)
    assert [p.identity for p in survivor.servers.peers()] == [REMOTE_IDENTITY]

    clock.advance(6)  # 16 s: lapsed
    recovered = survivor.recover_abandoned()
    assert sorted((e["delegation_id"], e["status"]) for e in recovered) == [
        ("queued-1", "interrupted"),
        ("running-1", "unknown"),
    ]
    assert all(e["abandoned"] for e in recovered)
    # (the survivor holds those completions now and offers them as recovered) ...
    offered = survivor.take_due()
    assert [e["delegation_id"] for e in offered] == ["held-1"]  # ... and the held row
    assert offered[0]["restored"]
    # Its claim is broken: the old holder can neither complete nor release it now.
    with pytest.raises(ClaimMismatchError):
        remote.complete("held-1", token)
    new_token = survivor.claim("held-1", "survivor-consumer")
    assert new_token and survivor.complete("held-1", new_token)
    assert backend.get("held-1").delivery_state == "delivered"  # type: ignore[union-attr]
    # Its work done elsewhere, the lapsed record is pruned.
    for row_id in ("queued-1", "running-1"):
        t = survivor.claim(row_id, "c")
        assert t and survivor.complete(row_id, t)
    survivor.servers.peers()
    assert REMOTE_IDENTITY not in {r.identity for r in backend.servers()}


def test_a_lapsed_server_that_comes_back_is_fenced_out(
    backend: LedgerBackend, clock: FakeClock
) -> None:
    remote = Ledger(backend, POLICY, clock=clock, identity=REMOTE_IDENTITY)
    remote.servers.register()
    remote.create("r", kind="delegation", state="running", session_key="s")
    survivor = Ledger(backend, POLICY, clock=clock)
    clock.advance(20)
    assert [e["status"] for e in survivor.recover_abandoned()] == ["unknown"]
    # The "dead" server was only paused: its late finish finds the row settled as unknown.
    assert not remote.finish(
        "r", expected="running", state="completed", event={"type": "async_delegation"}
    )
    assert backend.get("r").state == "unknown"  # type: ignore[union-attr]


def test_a_claim_taken_over_after_its_lease_cannot_be_completed_by_the_old_holder(
    backend: LedgerBackend, clock: FakeClock
) -> None:
    a = Ledger(backend, POLICY, clock=clock, identity=REMOTE_IDENTITY)
    b = Ledger(backend, POLICY, clock=clock)
    finished_row(a, "x")
    old = a.claim("x", "a")
    assert old
    clock.advance(POLICY.lease_seconds + 1)
    new = b.claim("x", "b")
    assert new and new != old
    with pytest.raises(ClaimMismatchError):
        a.complete("x", old)
    with pytest.raises(ClaimMismatchError):
        a.release("x", old)
    row = backend.get("x")
    assert row is not None and row.delivery_state == "pending" and row.claim_token == new
    assert b.complete("x", new)


def test_the_scheduler_wakes_when_a_remote_heartbeat_lapses_without_polling(
    backend: LedgerBackend,
) -> None:
    policy = DeliveryPolicy(peer_timeout_seconds=1.0)
    remote = Ledger(backend, policy, identity=REMOTE_IDENTITY)
    remote.servers.register()
    finished_row(remote, "orphan")
    assert remote.claim("orphan", "remote")  # held under a 300 s lease by a remote server
    survivor = Ledger(backend, policy)
    offers: list[tuple[float, dict]] = []
    sched = ReofferScheduler(
        survivor, lambda e: offers.append((time.time(), e)), max_sleep_seconds=60
    )
    started = time.time()
    sched.start()
    try:
        deadline = started + 10
        while not offers and time.time() < deadline:
            time.sleep(0.02)
    finally:
        sched.stop()
    assert [e["delegation_id"] for _, e in offers] == ["orphan"]
    # Offered once the 1 s heartbeat lapsed, long before any 60 s guard or 300 s lease.
    assert 0.9 <= offers[0][0] - started < 3.0
