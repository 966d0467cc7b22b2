"""``stalled``: the terminal state of a sub-agent stopped by its stall limit, on every backend.

It is an ordinary terminal state: written by ``finish`` with its event in one commit, never
left again, delivered like any other result (claimed, acknowledged once), and queryable.
"""

from __future__ import annotations

from delivery.ledger import Ledger
from delivery.rows import RowQuery
from delivery.states import TERMINAL_STATES, State, can_transition
from tests.delivery._support import delegation_event


def test_a_stalled_row_is_terminal_delivered_once_and_queryable(ledger: Ledger) -> None:
    assert State.STALLED in TERMINAL_STATES
    assert can_transition("running", "stalled") and not can_transition("queued", "stalled")
    assert not any(can_transition("stalled", target) for target in State)

    ledger.create("d1", kind="delegation", state="running", session_key="sess")
    event = delegation_event("d1", status="stalled", error="nothing moved for 300 s")
    assert ledger.finish("d1", expected="running", state="stalled", event=event)
    assert not ledger.finish("d1", expected="running", state="completed", event=event)

    row = ledger.get("d1")
    assert row is not None
    assert (row.state, row.delivery_state) == ("stalled", "pending")
    assert row.event is not None and row.event["error"] == "nothing moved for 300 s"
    assert [r.id for r in ledger.query(RowQuery(state="stalled"))] == ["d1"]

    claim = ledger.claim("d1", "consumer-a")
    assert claim
    assert ledger.claim("d1", "consumer-b") is None
    assert ledger.complete("d1", claim)
    done = ledger.get("d1")
    assert done is not None and (done.state, done.delivery_state) == ("stalled", "delivered")
