"""Deciding approvals the way every surface and the operator's CLI does
(``gateway.approvals``), on every backend: listed while their turn waits, decided once, and
one whose turn is gone (lapsed, or its holder dead) settled as denied and told apart. A
background unit's holds no session, and past its deadline or its process settles expired,
once, with one notice in the conversation."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest

from delivery.identity import current_identity
from delivery.session_backend import ApprovalRecord
from gateway.approvals import (
    EXPIRED_DISPLAY_KIND,
    AlreadyDecided,
    Expired,
    decide_approval,
    pending_approvals,
    settle_if_stale,
)
from gateway.session import SessionStore
from tests.sessions._support import make_session


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


def _ask_unit(
    store: SessionStore, aid: str, session_id: str, *, ttl: float = 60.0, owner: str | None = None
) -> ApprovalRecord:
    if store.get_session(session_id) is None:
        make_session(store, session_id)
    now = time.time()
    record = ApprovalRecord(
        aid,
        session_id,
        "",
        f"echo {aid}",
        "pending",
        now,
        unit_id=f"deleg_{aid}",
        owner=owner if owner is not None else str(current_identity()),
        expires_at=now + ttl,
    )
    assert store.ask_approval(record)
    return record


def _notices(store: SessionStore, session_id: str) -> list[Any]:
    rows = store.messages(session_id)
    return [r for r in rows if r.display_kind == EXPIRED_DISPLAY_KIND]


def test_a_background_units_approval_holds_no_session(store: SessionStore) -> None:
    # Asked with no turn running, and while another turn of the conversation runs.
    record = _ask_unit(store, "appr_u1", "sess_u")
    assert store.pending_approval("sess_u") is None  # the session is not busy with it
    store.take_turn("sess_u", "st_other")
    assert store.pending_approval("sess_u") is None
    assert store.end_turn("sess_u", "st_other")  # ending a turn denies nothing of the unit's
    assert store.get_approval(record.id).status == "pending"
    assert [r.id for r in pending_approvals(store)] == [record.id]
    listed = store.get_approval(record.id)
    assert listed.unit_id == "deleg_appr_u1" and listed.background
    assert decide_approval(store, record.id, True, by="test").status == "approved"
    with pytest.raises(AlreadyDecided):
        decide_approval(store, record.id, False)
    assert pending_approvals(store) == [] and _notices(store, "sess_u") == []


def test_a_units_approval_past_its_deadline_expires_once_with_one_notice(
    store: SessionStore,
) -> None:
    record = _ask_unit(store, "appr_u2", "sess_v", ttl=0.05)
    time.sleep(0.1)
    assert pending_approvals(store) == []  # settled on the way
    assert store.get_approval(record.id).status == "expired"
    assert settle_if_stale(store, record) is not None  # read again: nothing written twice
    with pytest.raises(AlreadyDecided):
        decide_approval(store, record.id, True)
    (notice,) = _notices(store, "sess_v")
    assert "nobody answered" in notice.content and record.id in notice.content
    # Deciding first is what expires one nobody listed.
    late = _ask_unit(store, "appr_u3", "sess_v", ttl=0.05)
    time.sleep(0.1)
    with pytest.raises(Expired) as expired:
        decide_approval(store, late.id, True)
    assert expired.value.record.status == "expired"
    assert len(_notices(store, "sess_v")) == 2


def test_a_units_approval_whose_process_died_expires_when_read(store: SessionStore) -> None:
    me = current_identity()
    gone = str(replace(me, start_ticks=me.start_ticks + 1))  # this pid, another (ended) process
    record = _ask_unit(store, "appr_u4", "sess_w", owner=gone)
    assert pending_approvals(store) == []
    assert store.get_approval(record.id).status == "expired"
    assert len(_notices(store, "sess_w")) == 1
