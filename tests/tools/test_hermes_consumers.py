"""The core contract as hermes-agent's and hermes-webui's consumers call it.

Those consumers release in a ``finally`` block and read a re-offered event's mark as
``evt.get("restored") is True``. Against this core a lost claim must answer with a false
value (never an exception) and leave the row as it was, and every re-offer (restore after a
restart, orphan re-offer, the re-offer scheduler) must carry ``restored: True`` as well as
the older ``_restored: True``. Real ledger on a tmp dir, no mocks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from delivery.errors import ClaimMismatchError
from delivery.event_display import display_metadata
from delivery.events import is_ledger_mark, is_restored, parse_event
from delivery.ledger import Ledger
from delivery.policy import DeliveryPolicy
from gateway.wake import format_wake_text
from tests.delivery._support import FakeClock, exited_identity, finished_row
from tools.async_delegation import (
    NOT_HOLDER,
    DelegationRuntime,
    aclaim_event_delivery,
    acomplete_event_delivery,
    arelease_event_delivery,
    claim_event_delivery,
    complete_event_delivery,
    configure_runtime,
    dispatch_async_delegation,
    get_durable_delegation,
    release_event_delivery,
    reset_runtime,
    restore_undelivered_completions,
)
from tools.process_registry import CompletionQueue

LEASE = 300.0
WAIT = 10.0


@pytest.fixture
def ledger_path(tmp_path: Path) -> str:
    return str(tmp_path / "ledger.db")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def runtime(ledger_path: str, clock: FakeClock) -> Iterator[DelegationRuntime]:
    rt = configure_runtime(
        ledger_path,
        policy=DeliveryPolicy(lease_seconds=LEASE),
        completion_queue=CompletionQueue(),
        clock=clock,
    )
    yield rt
    reset_runtime()


@pytest.fixture
def evt(runtime: DelegationRuntime) -> dict[str, Any]:
    dispatch_async_delegation(
        goal="task",
        runner=lambda: {"status": "completed", "summary": "ok"},
        session_key="agent:main:s1",
    )
    return runtime.queue.get(timeout=WAIT)


def taken_over(evt: dict[str, Any], clock: FakeClock) -> tuple[str, str]:
    """Consumer A claims, its lease lapses, consumer B claims: (A's claim, B's claim)."""
    stale = claim_event_delivery(evt, "hermes-gateway")
    assert stale
    clock.advance(LEASE + 1)
    current = claim_event_delivery(evt, "hermes-webui")
    assert current and current != stale
    return stale, current


def row_of(evt: dict[str, Any]) -> dict[str, Any]:
    row = get_durable_delegation(evt["delegation_id"])
    assert row is not None
    return row


# -- A: a claim that is no longer the holder's answers quietly ---------------------------------


class TestStaleClaims:
    def test_release_in_finally_after_a_take_over_does_not_raise(
        self, evt: dict[str, Any], clock: FakeClock
    ) -> None:
        stale, current = taken_over(evt, clock)
        before = row_of(evt)
        released: list[str] = []
        try:
            pass  # the hand-off that took longer than the lease
        finally:
            released.append(release_event_delivery(evt, stale))
        assert released == [NOT_HOLDER] and not released[0]
        assert row_of(evt) == before  # untouched: B still holds it
        assert complete_event_delivery(evt, current) is True
        assert row_of(evt)["delivery_state"] == "delivered"

    def test_retryable_release_with_a_stale_claim_refunds_nothing(
        self, evt: dict[str, Any], clock: FakeClock
    ) -> None:
        stale, _ = taken_over(evt, clock)
        before = row_of(evt)
        assert not release_event_delivery(evt, stale, retryable=True)
        assert row_of(evt) == before

    def test_complete_with_a_stale_claim_is_false(
        self, evt: dict[str, Any], clock: FakeClock
    ) -> None:
        stale, current = taken_over(evt, clock)
        before = row_of(evt)
        assert complete_event_delivery(evt, stale) is False
        assert row_of(evt) == before
        # ... and after B acknowledged: still False, B's acknowledgement stands.
        assert complete_event_delivery(evt, current) is True
        delivered = row_of(evt)
        assert complete_event_delivery(evt, stale) is False
        assert not release_event_delivery(evt, stale)
        assert row_of(evt) == delivered and delivered["claim_token"] == current

    def test_drop_with_a_stale_claim_is_false_and_leaves_the_row(
        self, evt: dict[str, Any], clock: FakeClock
    ) -> None:
        from tools.async_delegation import drop_event_delivery

        stale, current = taken_over(evt, clock)
        before = row_of(evt)
        assert drop_event_delivery(evt, stale, "session gone") is False
        assert row_of(evt) == before  # B still holds it, nothing dropped
        assert drop_event_delivery(evt, current, "session gone") is True
        assert row_of(evt)["delivery_state"] == "dropped"

    def test_the_holder_still_gets_the_state(self, evt: dict[str, Any]) -> None:
        claim = claim_event_delivery(evt, "hermes-gateway")
        assert claim
        assert release_event_delivery(evt, claim) == "pending"

    def test_a_stale_claim_is_logged(
        self, evt: dict[str, Any], clock: FakeClock, caplog: pytest.LogCaptureFixture
    ) -> None:
        stale, _ = taken_over(evt, clock)
        with caplog.at_level(logging.INFO, logger="tools.async_delegation"):
            release_event_delivery(evt, stale)
            complete_event_delivery(evt, stale)
        levels = [r.levelno for r in caplog.records if evt["delegation_id"] in r.getMessage()]
        assert levels == [logging.INFO, logging.WARNING]

    def test_async_twins_answer_the_same(self, evt: dict[str, Any], clock: FakeClock) -> None:
        async def consume() -> tuple[str, bool, bool]:
            stale = await aclaim_event_delivery(evt, "hermes-gateway")
            assert stale
            clock.advance(LEASE + 1)
            current = await aclaim_event_delivery(evt, "hermes-webui")
            assert current
            before = row_of(evt)
            try:
                acked = await acomplete_event_delivery(evt, stale)
            finally:
                released = await arelease_event_delivery(evt, stale, retryable=True)
            assert row_of(evt) == before
            return released, acked, await acomplete_event_delivery(evt, current)

        assert asyncio.run(consume()) == (NOT_HOLDER, False, True)

    def test_programming_errors_still_raise(self, evt: dict[str, Any]) -> None:
        claim = claim_event_delivery(evt, "hermes-gateway")
        assert claim
        before = row_of(evt)
        with pytest.raises(ValueError, match="claim token"):
            release_event_delivery(evt, None)
        with pytest.raises(TypeError, match="must be a dict"):
            release_event_delivery("deleg_x", claim)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="claim token"):
            asyncio.run(arelease_event_delivery(evt, ""))
        with pytest.raises(ValueError, match="claim token"):
            asyncio.run(acomplete_event_delivery(evt, None))
        with pytest.raises(TypeError, match="must be a dict"):
            asyncio.run(acomplete_event_delivery(["x"], claim))  # type: ignore[arg-type]
        assert row_of(evt) == before

    def test_the_ledger_itself_still_raises(self, runtime: DelegationRuntime) -> None:
        # Only the consumer contract is quiet; the ledger's rules stay strict.
        finished_row(runtime.ledger, "deleg_ledger_rule")
        assert runtime.ledger.claim("deleg_ledger_rule", "c")
        with pytest.raises(ClaimMismatchError):
            runtime.ledger.release("deleg_ledger_rule", "0" * 32)


# -- B: re-offered events carry ``restored: True`` --------------------------------------------


def assert_marked(event: dict[str, Any]) -> None:
    assert event.get("restored") is True  # what hermes' consumers read
    assert event.get("_restored") is True  # what older consumers here read
    assert parse_event(event).restored


class TestRestoredMark:
    def test_restore_after_a_restart(
        self, evt: dict[str, Any], ledger_path: str, clock: FakeClock
    ) -> None:
        assert evt.get("restored") is None  # a live event is not marked
        configure_runtime(ledger_path, completion_queue=CompletionQueue(), clock=clock)  # restart
        fresh: queue.Queue[dict[str, Any]] = queue.Queue()
        assert restore_undelivered_completions(fresh) == 1
        restored = fresh.get_nowait()
        assert_marked(restored)
        assert "restored" not in row_of(evt)["event"]  # the stored event stays as written
        claim = claim_event_delivery(restored, "hermes-gateway")
        assert claim and complete_event_delivery(restored, claim) is True

    def test_orphan_re_offer(self, runtime: DelegationRuntime) -> None:
        dead = Ledger(
            runtime.ledger.backend, clock=runtime.ledger.clock, identity=exited_identity()
        )
        finished_row(dead, "deleg_orphan")
        (offered,) = runtime.ledger.take_due()
        assert offered["delegation_id"] == "deleg_orphan"
        assert_marked(offered)

    def test_scheduler_re_offer(self, ledger_path: str) -> None:
        rt = configure_runtime(ledger_path, completion_queue=CompletionQueue())
        try:
            dead = Ledger(rt.ledger.backend, identity=exited_identity())
            finished_row(dead, "deleg_sched")
            rt.start_scheduler()
            offered = rt.queue.get(timeout=WAIT)
            assert offered["delegation_id"] == "deleg_sched"
            assert_marked(offered)
        finally:
            reset_runtime()


BASE = {"type": "async_delegation", "delegation_id": "deleg_1", "status": "completed"}


class TestRestoredParsing:
    @pytest.mark.parametrize(
        ("extra", "restored"),
        [
            ({}, False),
            ({"restored": True}, True),
            ({"_restored": True}, True),
            ({"restored": True, "_restored": True}, True),
            # Not exactly True: the event's own data (a count, a flag of its work).
            ({"restored": 1}, False),
            ({"restored": "true"}, False),
            ({"restored": 2}, False),
            ({"restored": False, "_restored": True}, True),
        ],
    )
    def test_either_spelling(self, extra: dict[str, Any], restored: bool) -> None:
        raw = {**BASE, **extra}
        assert is_restored(raw) is restored
        assert parse_event(raw).restored is restored
        assert ("Re-delivered" in format_wake_text(raw, now=0)) is restored

    def test_to_dict_writes_both_spellings(self) -> None:
        marked = dataclasses.replace(parse_event(BASE), restored=True).to_dict()
        assert marked["restored"] is True and marked["_restored"] is True
        unmarked = dataclasses.replace(parse_event(marked), restored=False).to_dict()
        assert "restored" not in unmarked and "_restored" not in unmarked
        # An event's own ``restored`` value is kept: it was never the mark.
        own = dataclasses.replace(parse_event({**BASE, "restored": 3}), restored=False)
        assert own.to_dict()["restored"] == 3

    def test_the_mark_is_not_shown_as_event_data(self) -> None:
        marked = {"type": "watch_match", "pattern": "ERROR", "restored": True, "_restored": True}
        text = format_wake_text(marked, now=0)
        assert "Re-delivered" in text and "restored: True" not in text
        assert display_metadata(marked)["fields"] == ["pattern"]
        own = {"type": "watch_match", "pattern": "ERROR", "restored": 4}
        assert "restored: 4" in format_wake_text(own, now=0)
        assert display_metadata(own)["fields"] == ["pattern", "restored"]
        assert is_ledger_mark("restored", True) and not is_ledger_mark("restored", 1)


def test_dispatch_takes_max_queued_delegations_and_rows_name_origin_and_result(
    tmp_path,
) -> None:
    import threading

    from tools import async_delegation as ad
    from tools.completion_queue import CompletionQueue

    queue = CompletionQueue()
    ad.reset_runtime()
    ad.configure_runtime(str(tmp_path / "ledger.db"), completion_queue=queue)
    gate = threading.Event()
    try:

        def slow() -> dict:
            gate.wait(10)
            return {"status": "completed", "summary": "the answer"}

        first = ad.dispatch_async_delegation(
            goal="a", runner=slow, max_async_children=1, origin_session_id="sess-1"
        )
        assert first["status"] == "dispatched"
        beyond = ad.dispatch_async_delegation(
            goal="b", runner=slow, max_async_children=1, max_queued_delegations=0
        )
        assert beyond["status"] == "rejected"
        row = ad.get_durable_delegation(first["delegation_id"])
        assert row is not None and row["origin_session_id"] == "sess-1" and row["result"] is None
        gate.set()
        evt = queue.get(timeout=10)
        row = ad.get_durable_delegation(evt["delegation_id"])
        assert row is not None and row["result"]["summary"] == "the answer"
    finally:
        gate.set()
        ad.reset_runtime()


def test_get_durable_delegation_answers_in_hermes_shapes(tmp_path: Path) -> None:
    """hermes-agent's ``get_durable_delegation`` answers ``origin_session`` (the routing key),
    ``origin_session_id`` (the raw API session id), ``dispatched_at``, ``completed_at`` and
    ``result`` (the runner's result as a dict, None until it finished); its consumers read
    those. Today's keys (every ledger column) stay."""
    from tools import async_delegation as ad
    from tools.completion_queue import CompletionQueue

    queue = CompletionQueue()
    ad.reset_runtime()
    ad.configure_runtime(str(tmp_path / "ledger.db"), completion_queue=queue)
    try:
        single = ad.dispatch_async_delegation(
            goal="find it",
            context="ctx",
            session_key="agent:main:telegram:dm:42",
            origin_session_id="api-7",
            runner=lambda: {"status": "completed", "summary": "found", "api_calls": 3},
        )
        batch = ad.dispatch_async_delegation_batch(
            goals=["a", "b"],
            session_key="agent:main:telegram:dm:42",
            runners=[
                lambda: {"status": "completed", "summary": "A"},
                lambda: {"status": "failed", "error": "B broke"},
            ],
        )
        done = {queue.get(timeout=10)["delegation_id"] for _ in range(2)}
        assert done == {single["delegation_id"], batch["delegation_id"]}

        row = ad.get_durable_delegation(single["delegation_id"])
        assert row is not None
        assert row["origin_session"] == "agent:main:telegram:dm:42"
        assert row["origin_session_id"] == "api-7"
        assert row["delegation_id"] == single["delegation_id"]
        result = row["result"]
        assert isinstance(result, dict)
        assert result["status"] == "completed" and result["summary"] == "found"
        assert result["api_calls"] == 3 and "duration_seconds" in result
        # The request's routing and task fields are the row's, not the result's.
        assert not {"goal", "context", "session_key", "origin_session_id"} & set(result)
        assert isinstance(row["dispatched_at"], float)
        assert row["completed_at"] >= row["dispatched_at"]
        # Today's keys stay as they were.
        assert row["id"] == single["delegation_id"] and row["session_key"] == row["origin_session"]
        assert row["delivery_state"] == "pending" and row["delivery_attempts"] == 0
        assert row["state"] == "completed" and row["event"]["summary"] == "found"

        row = ad.get_durable_delegation(batch["delegation_id"])
        assert row is not None and row["origin_session_id"] is None
        result = row["result"]
        assert isinstance(result, dict) and result["status"] == "failed"
        assert [r.get("summary") or r.get("error") for r in result["results"]] == ["A", "B broke"]
    finally:
        ad.reset_runtime()

    # A row of no routing key answers "" like hermes' NOT NULL column.
    ad.configure_runtime(str(tmp_path / "ledger.db"), completion_queue=CompletionQueue())
    try:
        gate = ad.dispatch_async_delegation(goal="x", runner=lambda: {"summary": "y"})
        row = ad.get_durable_delegation(gate["delegation_id"])
        assert row is not None and row["origin_session"] == ""
    finally:
        ad.reset_runtime()
