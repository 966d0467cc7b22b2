"""Conformance of the storage interfaces, over every backend: each is both a ``LedgerBackend``
(the rules' work) and a ``LedgerViews`` (what operators, metrics and pages read), its rows
are ``LedgerRow`` records, and every view answers alike (queries by ``RowQuery``, the audit
log, the servers, writer counters, and the delivery counts behind ``reveille_delivery_rows``).
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from delivery.backend import LedgerBackend, LedgerStore, LedgerViews
from delivery.ledger import Ledger
from delivery.peers import ServerRecord
from delivery.rows import LedgerRow, PendingCounts, RowQuery
from tests.delivery._support import FakeClock

EVENT = {"type": "async_delegation", "delegation_id": "x", "status": "completed"}


def _members(protocol: type) -> set[str]:
    return {
        name
        for name, _ in inspect.getmembers(protocol)
        if not name.startswith("_") and name in protocol.__dict__
    }


def test_every_backend_implements_the_work_and_the_views(backend: LedgerStore) -> None:
    assert isinstance(backend, LedgerBackend)
    assert isinstance(backend, LedgerViews)
    assert isinstance(backend, LedgerStore)
    # Not only present: callable, with the protocol's parameters (isinstance checks names).
    for protocol in (LedgerBackend, LedgerViews):
        for name in _members(protocol):
            declared = getattr(protocol, name)
            if isinstance(declared, property):
                assert getattr(backend, name) is not None, name
                continue
            implemented = getattr(backend, name)
            assert callable(implemented), name
            wanted = list(inspect.signature(declared).parameters)[1:]  # without self
            assert list(inspect.signature(implemented).parameters) == wanted, name


def test_the_views_protocol_holds_no_write(backend: LedgerStore) -> None:
    assert _members(LedgerViews) == {
        "query",
        "audit_log",
        "servers",
        "stats",
        "delivery_counts",
        "pending_counts",
    }
    assert not {"write", "submit", "submit_async", "close"} & _members(LedgerViews)


def _finished(ledger: Ledger, row_id: str, **fields: str) -> None:
    ledger.create(row_id, kind=fields.pop("kind", "delegation"), state="running", **fields)
    assert ledger.finish(row_id, expected="running", state="completed", event={**EVENT})


def test_rows_are_frozen_records_decoded_once(ledger: Ledger, backend: LedgerStore) -> None:
    _finished(ledger, "r1", session_key="s", goal="g")
    row = backend.get("r1")
    assert isinstance(row, LedgerRow)
    assert (row.id, row.kind, row.state, row.delivery_state) == (
        "r1",
        "delegation",
        "completed",
        "pending",
    )
    assert row.event == EVENT and row.request is None and row.goal == "g"
    assert (row.delivery_attempts, row.refunds, row.restored, row.claim_expires_at) == (0, 0, 0, 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.state = "failed"  # type: ignore[misc]
    # Each read is its own record: editing one's event changes neither the store nor another.
    assert row.event is not None
    row.event["status"] = "edited"
    again = backend.get("r1")
    assert again is not None and again.event == EVENT
    assert row.as_dict()["event"] is row.event and set(row.as_dict()) == {
        f.name for f in dataclasses.fields(LedgerRow)
    }
    for scan in (
        backend.pending_with_event(10),
        backend.due(ledger.clock() + 10**6, 10),
        backend.rows_held_by(ledger.identity, 10),
        backend.query(RowQuery()),
    ):
        assert [type(r) for r in scan] == [LedgerRow]


def test_query_takes_one_row_query(ledger: Ledger, backend: LedgerStore, clock: FakeClock) -> None:
    ledger.create("a", kind="delegation", session_key="key-a")
    clock.advance(1)
    ledger.create("b", kind="process", origin_session_id="api-b")
    clock.advance(1)
    _finished(ledger, "c", origin_ui_session_id="ui-c")

    def ids(query: RowQuery) -> list[str]:
        return [r.id for r in backend.query(query)]

    assert ids(RowQuery()) == ["c", "b", "a"]  # newest first
    assert ids(RowQuery(oldest_first=True)) == ["a", "b", "c"]
    assert ids(RowQuery(limit=2)) == ["c", "b"] and ids(RowQuery(limit=0)) == []
    assert ids(RowQuery(kind="process")) == ["b"]
    assert ids(RowQuery(state="completed")) == ["c"]
    assert ids(RowQuery(state="queued", kind="delegation")) == ["a"]
    assert ids(RowQuery(delivery_state="pending", oldest_first=True)) == ["a", "b", "c"]
    # a session matches its routing key and either origin id
    assert ids(RowQuery(session="key-a")) == ["a"]
    assert ids(RowQuery(session="api-b")) == ["b"]
    assert ids(RowQuery(session="ui-c")) == ["c"]
    assert ids(RowQuery(session="nobody")) == []
    assert ledger.query(RowQuery(kind="process")) == backend.query(RowQuery(kind="process"))


def test_audit_log_servers_and_stats(ledger: Ledger, backend: LedgerStore) -> None:
    _finished(ledger, "r1")
    assert backend.audit_log("r1") == []
    assert ledger.drop("r1", "session deleted")
    (entry,) = backend.audit_log("r1")
    assert entry == {"at": ledger.clock(), "action": "drop", "detail": "session deleted"}
    assert backend.audit_log("nope") == []

    assert backend.servers() == []
    ledger.servers.register("me")
    (record,) = backend.servers()
    assert isinstance(record, ServerRecord) and record.identity == ledger.identity

    stats = backend.stats()
    assert stats["commits"] >= 3 and stats["operations"] >= stats["commits"]
    assert "durable_commits" in stats


def test_delivery_counts_count_pending_rows_and_their_claims(
    ledger: Ledger, backend: LedgerStore, clock: FakeClock
) -> None:
    assert backend.delivery_counts() == {"pending": 0, "claimed": 0}
    ledger.create("running", kind="delegation", state="running")  # pending from the start
    _finished(ledger, "a")
    _finished(ledger, "b")
    _finished(ledger, "c")
    assert backend.delivery_counts() == {"pending": 4, "claimed": 0}

    token_a = ledger.claim("a", "test")
    token_b = ledger.claim("b", "test")
    assert token_a and token_b
    assert backend.delivery_counts() == {"pending": 4, "claimed": 2}
    assert ledger.complete("a", token_a)  # delivered: no longer waiting
    assert backend.delivery_counts() == {"pending": 3, "claimed": 1}
    assert ledger.release("b", token_b) == "pending"  # given back: waiting, unclaimed
    assert backend.delivery_counts() == {"pending": 3, "claimed": 0}
    assert ledger.drop("c", "session deleted")  # settled: not waiting
    assert backend.delivery_counts() == {"pending": 2, "claimed": 0}

    # A lapsed claim still counts until the row is claimed again or settled.
    clock.advance(10)
    token_b = ledger.claim("b", "test")
    assert token_b
    clock.advance(ledger.policy.lease_seconds + 1)
    assert backend.delivery_counts() == {"pending": 2, "claimed": 1}


def test_pending_counts_by_state_and_those_due_later(
    ledger: Ledger, backend: LedgerStore, clock: FakeClock
) -> None:
    assert backend.pending_counts(clock()) == PendingCounts({}, 0)
    ledger.create("queued", kind="delegation")
    ledger.create("running", kind="delegation", state="running")
    _finished(ledger, "a")
    _finished(ledger, "b")
    _finished(ledger, "c")
    assert ledger.drop("c", "session deleted")  # settled: owes nothing
    counts = backend.pending_counts(clock())
    assert counts == PendingCounts({"queued": 1, "running": 1, "completed": 2}, 0)

    token = ledger.claim("a", "test")
    assert token
    assert ledger.release("a", token, retryable=True) == "pending"  # backs off: due later
    assert backend.pending_counts(clock()).due_later == 1
    token = ledger.claim("b", "test")
    assert token and ledger.complete("b", token)
    assert backend.pending_counts(clock()) == PendingCounts(
        {"queued": 1, "running": 1, "completed": 1}, 1
    )
    clock.advance(24 * 3600)  # past any backoff: due now
    assert backend.pending_counts(clock()).due_later == 0
