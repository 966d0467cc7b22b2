"""Conformance of running turns (leases) and approvals, on every backend: one holder per
session across processes, a lapsed or dead holder loses it and what it asked is denied, an
approval is pending only while its turn holds the session and is decided once."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from delivery.identity import current_identity, process_start_ticks
from delivery.session_backend import ApprovalRecord, SessionBackend
from gateway.session import SessionStore


def _approval(aid: str, session_id: str, stream_id: str) -> ApprovalRecord:
    return ApprovalRecord(aid, session_id, stream_id, "rm -rf build", "pending", time.time())


def _dead_identity() -> str:
    """The identity of a process of this host that has exited."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        ticks = process_start_ticks(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    me = current_identity()
    return f"{me.host}|{me.boot_id}|{proc.pid}|{ticks}"


def test_one_turn_holds_a_session_until_it_ends(store: SessionStore) -> None:
    lease = store.take_turn("sess_a", "st_1")
    assert lease.stream_id == "st_1" and lease.owner == str(current_identity())
    assert store.take_turn("sess_a", "st_2").stream_id == "st_1"  # busy, even for us
    assert set(store.running_turns()) == {"sess_a"}
    assert store.renew_turn("sess_a", "st_1")
    assert not store.renew_turn("sess_a", "st_2")
    assert not store.end_turn("sess_a", "st_2")  # not its lease
    assert store.end_turn("sess_a", "st_1")
    assert store.running_turns() == {}
    assert store.take_turn("sess_a", "st_2").stream_id == "st_2"


def test_sessions_are_held_apart(store: SessionStore) -> None:
    store.take_turn("sess_a", "st_1", wakeup=True)
    assert store.take_turn("sess_b", "st_2").stream_id == "st_2"
    turns = store.running_turns()
    assert set(turns) == {"sess_a", "sess_b"} and turns["sess_a"].wakeup


def test_a_lapsed_lease_is_taken_over_and_its_approval_denied(store: SessionStore) -> None:
    store.take_turn("sess_a", "st_1", ttl_seconds=0.05)
    assert store.ask_approval(_approval("appr_1", "sess_a", "st_1"))
    time.sleep(0.1)
    assert store.running_turns() == {}
    assert store.pending_approval("sess_a") is None
    assert not store.renew_turn("sess_a", "st_2")
    assert store.take_turn("sess_a", "st_2").stream_id == "st_2"
    approval = store.get_approval("appr_1")
    assert approval is not None and approval.status == "denied"


def test_a_dead_holders_lease_is_broken_at_once(backend: SessionBackend) -> None:
    dead = _dead_identity()
    backend.take_turn("sess_a", "st_1", dead, wakeup=False, ttl_seconds=60, is_dead=lambda _: False)
    store = SessionStore(backend)
    assert store.running_turns() == {}  # the dead holder keeps nothing busy
    assert store.take_turn("sess_a", "st_2").stream_id == "st_2"


def test_approvals_are_pending_while_their_turn_runs(store: SessionStore) -> None:
    assert not store.ask_approval(_approval("appr_0", "sess_a", "st_1"))  # no such turn
    store.take_turn("sess_a", "st_1")
    assert not store.ask_approval(_approval("appr_0", "sess_a", "st_other"))
    assert store.ask_approval(_approval("appr_1", "sess_a", "st_1"))
    pending = store.pending_approval("sess_a")
    assert pending is not None and (pending.id, pending.command) == ("appr_1", "rm -rf build")
    assert store.pending_approval("sess_b") is None
    store.end_turn("sess_a", "st_1")
    assert store.pending_approval("sess_a") is None
    ended = store.get_approval("appr_1")
    assert ended is not None and ended.status == "denied"


def test_an_approval_is_decided_once(store: SessionStore) -> None:
    store.take_turn("sess_a", "st_1")
    store.ask_approval(_approval("appr_1", "sess_a", "st_1"))
    decided, changed = store.decide_approval("appr_1", True)
    assert changed and decided.status == "approved"
    again, changed = store.decide_approval("appr_1", False)
    assert not changed and again.status == "approved"
    assert store.pending_approval("sess_a") is None
    with pytest.raises(KeyError):
        store.decide_approval("appr_unknown", True)
    assert store.get_approval("appr_unknown") is None


def test_racing_takers_get_one_lease(store: SessionStore) -> None:
    winners: list[str] = []
    barrier = threading.Barrier(8)

    def take(i: int) -> None:
        barrier.wait()
        if store.take_turn("sess_race", f"st_{i}").stream_id == f"st_{i}":
            winners.append(f"st_{i}")

    threads = [threading.Thread(target=take, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1
    assert store.running_turns()["sess_race"].stream_id == winners[0]


def test_approvals_are_counted_by_status(backend: SessionBackend) -> None:
    store = SessionStore(backend)
    assert backend.approval_counts() == {}
    store.take_turn("sess_a", "st_1")
    store.take_turn("sess_b", "st_2")
    for aid, session, stream in [("a1", "sess_a", "st_1"), ("a2", "sess_b", "st_2")]:
        assert store.ask_approval(_approval(aid, session, stream))
    assert backend.approval_counts() == {"pending": 2}
    store.decide_approval("a1", True)
    assert backend.approval_counts() == {"pending": 1, "approved": 1}
