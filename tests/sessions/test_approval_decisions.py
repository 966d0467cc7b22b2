"""Deciding approvals the way every surface and the operator's CLI does
(``gateway.approvals``), on every backend: listed while their turn waits, decided once, and
one whose turn is gone (lapsed, or its holder dead) settled as denied and told apart."""

from __future__ import annotations

import time

import pytest

from delivery.session_backend import ApprovalRecord
from gateway.approvals import AlreadyDecided, Expired, decide_approval, pending_approvals
from gateway.session import SessionStore


def _ask(store: SessionStore, aid: str, session_id: str, stream_id: str, **lease) -> ApprovalRecord:
    store.take_turn(session_id, stream_id, **lease)
    record = ApprovalRecord(aid, session_id, stream_id, f"echo {aid}", "pending", time.time())
    assert store.ask_approval(record)
    return record


def test_pending_approvals_are_listed_and_decided_once(store: SessionStore) -> None:
    first = _ask(store, "appr_1", "sess_a", "st_a")
    second = _ask(store, "appr_2", "sess_b", "st_b")
    assert [r.id for r in pending_approvals(store)] == [first.id, second.id]
    decided = decide_approval(store, first.id, True)
    assert decided.status == "approved"
    with pytest.raises(AlreadyDecided):
        decide_approval(store, first.id, False)
    assert store.get_approval(first.id).status == "approved"
    with pytest.raises(KeyError):
        decide_approval(store, "appr_forged", True)
    assert [r.id for r in pending_approvals(store)] == [second.id]
    assert decide_approval(store, second.id, False).status == "denied"
    assert pending_approvals(store) == []


def test_an_approval_whose_turn_is_gone_expires(store: SessionStore) -> None:
    stale = _ask(store, "appr_3", "sess_c", "st_c", ttl_seconds=0.05)
    time.sleep(0.1)
    assert pending_approvals(store) == []
    with pytest.raises(Expired) as expired:
        decide_approval(store, stale.id, True)
    assert expired.value.record.status == "denied"
    assert store.get_approval(stale.id).status == "denied"
    with pytest.raises(AlreadyDecided):
        decide_approval(store, stale.id, True)  # settled: nothing left to decide


def test_an_approval_of_an_ended_turn_is_denied(store: SessionStore) -> None:
    record = _ask(store, "appr_4", "sess_d", "st_d")
    assert store.end_turn("sess_d", "st_d")
    with pytest.raises(AlreadyDecided):
        decide_approval(store, record.id, True)
    assert store.get_approval(record.id).status == "denied"
