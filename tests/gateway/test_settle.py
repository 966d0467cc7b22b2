"""The settle protocol alone (``gateway.settle``), on a real SQLite ledger: claim each,
deliver once, settle all by one verdict, refusals refunded; a claim held elsewhere is left
out; a crash between claim and settle leaves the row to be offered again, and it is then
delivered once only. The clock is the ledger's own (no sleeping through leases)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

import tools.async_delegation as ad
from delivery.events import CompletionEvent, parse_event
from delivery.ledger import Ledger
from delivery.rows import LedgerRow
from gateway.session import SessionGone
from gateway.settle import Settler, Verdict
from gateway.wake import WakeDeliveryError
from tools.completion_queue import CompletionQueue


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def ledger(tmp_path: Path, clock: Clock) -> Iterator[Ledger]:
    runtime = ad.configure_runtime(
        str(tmp_path / "ledger.db"), completion_queue=CompletionQueue(), clock=clock
    )
    yield runtime.ledger
    ad.reset_runtime()


def _finished(ledger: Ledger, row_id: str) -> CompletionEvent:
    evt = {
        "type": "completion",
        "delivery_id": row_id,
        "origin_session_id": "s1",
        "command": f"job {row_id}",
        "exit_code": 0,
        "output": "ok",
    }
    ledger.create(row_id, kind="process", state="running", request=evt, goal=row_id)
    assert ledger.finish(row_id, expected="running", state="completed", event=evt)
    return parse_event(evt)


def _row(ledger: Ledger, row_id: str) -> LedgerRow:
    row = ledger.get(row_id)
    assert row is not None
    return row


class Target:
    """Records every hand-off and answers with ``verdict`` (or raises ``error``)."""

    def __init__(self, verdict: Verdict | None = None, error: Exception | None = None) -> None:
        self.verdict = verdict or Verdict.delivered()
        self.error = error
        self.batches: list[list[str]] = []

    async def __call__(self, events: Sequence[CompletionEvent]) -> Verdict:
        self.batches.append([e.key for e in events])
        if self.error is not None:
            raise self.error
        return self.verdict


async def test_each_is_claimed_the_batch_delivered_once_and_every_claim_completed(
    ledger: Ledger,
) -> None:
    events = [_finished(ledger, f"proc_{i}") for i in range(3)]
    target = Target()
    results = await Settler("test").run("s1", events, target)
    assert target.batches == [["proc_0", "proc_1", "proc_2"]]
    assert {k: r.outcome for k, r in results.items()} == dict.fromkeys(
        ["proc_0", "proc_1", "proc_2"], "delivered"
    )
    for event in events:
        row = _row(ledger, event.key)
        assert (row.delivery_state, row.delivery_attempts) == ("delivered", 1)


async def test_a_transient_refusal_is_refunded_and_offered_again(
    ledger: Ledger, clock: Clock
) -> None:
    events = [_finished(ledger, "proc_a"), _finished(ledger, "proc_b")]
    refusing = Target(error=WakeDeliveryError("busy", transient=True))
    results = await Settler("test").run("s1", events, refusing)
    assert all(r.outcome == "released" and r.claimed and r.retryable for r in results.values())
    for event in events:
        row = _row(ledger, event.key)
        assert row.delivery_state == "pending" and row.refunds == 1
    clock.now += 3600  # past the backoff
    again = Target()
    await Settler("test").run("s1", events, again)
    assert again.batches == [["proc_a", "proc_b"]]
    assert _row(ledger, "proc_a").delivery_state == "delivered"


async def test_a_refusal_that_was_the_deliverys_fault_spends_the_attempt(ledger: Ledger) -> None:
    event = _finished(ledger, "proc_x")
    results = await Settler("test").run("s1", [event], Target(error=RuntimeError("boom")))
    assert results["proc_x"].outcome == "released" and not results["proc_x"].retryable
    row = _row(ledger, "proc_x")
    assert (row.delivery_state, row.delivery_attempts, row.refunds) == ("pending", 1, 0)


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (SessionGone("s1"), "session s1 was deleted"),
        (SessionGone("s1", reason="the chat blocked the bot"), "the chat blocked the bot"),
        (WakeDeliveryError("HTTP 404", transient=False, status=404), "session s1 was deleted"),
    ],
)
async def test_a_gone_session_drops_every_claim_with_the_reason(
    ledger: Ledger, error: Exception, reason: str
) -> None:
    events = [_finished(ledger, "proc_1"), _finished(ledger, "proc_2")]
    results = await Settler("test").run("s1", events, Target(error=error))
    assert {r.outcome for r in results.values()} == {"dropped"}
    for event in events:
        row = _row(ledger, event.key)
        assert (row.delivery_state, row.settled_reason) == ("dropped", reason)


async def test_a_row_claimed_elsewhere_is_left_out_of_the_batch(ledger: Ledger) -> None:
    mine, theirs = _finished(ledger, "proc_m"), _finished(ledger, "proc_t")
    assert ledger.claim("proc_t", "another-server")
    target = Target()
    results = await Settler("test").run("s1", [mine, theirs], target)
    assert target.batches == [["proc_m"]]
    assert results["proc_t"].outcome == "held" and not results["proc_t"].claimed
    assert _row(ledger, "proc_t").delivery_state == "pending"


async def test_nothing_claimed_means_nothing_delivered(ledger: Ledger) -> None:
    event = _finished(ledger, "proc_d")
    await Settler("test").run("s1", [event], Target())
    target = Target()
    results = await Settler("test").run("s1", [event], target)  # delivered already
    assert target.batches == [] and results["proc_d"].outcome == "held"


async def test_a_crash_between_claim_and_settle_is_offered_again_and_delivered_once(
    ledger: Ledger, clock: Clock
) -> None:
    event = _finished(ledger, "proc_c")
    # The first server claims, then dies before it settles: its claim is all that is left.
    crashed = await Settler("dead-server").claim_each([event])
    assert [c.event.key for c in crashed] == ["proc_c"]
    target = Target()
    assert (await Settler("test").run("s1", [event], target))["proc_c"].outcome == "held"
    clock.now += 301  # the lease ran out
    results = await Settler("test").run("s1", [event], target)
    assert results["proc_c"].outcome == "delivered" and target.batches == [["proc_c"]]
    # The dead server's late settlement finds its claim lost: the row stays delivered once.
    await Settler("dead-server").settle(crashed, Verdict.released(retryable=False))
    row = _row(ledger, "proc_c")
    assert (row.delivery_state, row.delivery_attempts) == ("delivered", 2)
    assert (await Settler("test").run("s1", [event], target))["proc_c"].outcome == "held"
    assert target.batches == [["proc_c"]]


async def test_cancelled_mid_delivery_gives_every_claim_back_refunded(ledger: Ledger) -> None:
    events = [_finished(ledger, "proc_1"), _finished(ledger, "proc_2")]
    entered = asyncio.Event()

    async def hangs(batch: Sequence[CompletionEvent]) -> Verdict:
        entered.set()
        await asyncio.Event().wait()
        raise AssertionError("never answered")

    run = asyncio.create_task(Settler("test").run("s1", events, hangs))
    await entered.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    for event in events:
        row = _row(ledger, event.key)
        assert row.delivery_state == "pending" and row.refunds == 1


@pytest.mark.parametrize(("stored", "state"), [(True, "delivered"), (False, "pending")])
async def test_a_later_verdict_settles_once_the_hand_off_is_stored(
    ledger: Ledger, stored: bool, state: str
) -> None:
    events = [_finished(ledger, "proc_1"), _finished(ledger, "proc_2")]
    answer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    announced: list[list[str]] = []

    async def after(settled: Sequence[CompletionEvent]) -> None:
        announced.append([e.key for e in settled])

    settler = Settler("test", after_late=after)
    results = await settler.run("s1", events, Target(Verdict.later(answer)))
    assert {r.outcome for r in results.values()} == {"later"}
    assert _row(ledger, "proc_1").claim_consumer == "test"  # still held while the turn runs
    answer.set_result(stored)
    await settler.drain(5.0)
    for event in events:
        row = _row(ledger, event.key)
        assert row.delivery_state == state
        assert row.refunds == (0 if stored else 1)
    assert announced == [["proc_1", "proc_2"]]


async def test_two_consumers_racing_for_the_same_rows_deliver_each_once(ledger: Ledger) -> None:
    events = [_finished(ledger, f"proc_{i}") for i in range(4)]
    first, second = Target(), Target()
    await asyncio.gather(
        Settler("server-1").run("s1", events, first),
        Settler("server-2").run("s1", list(reversed(events)), second),
    )
    handed = sorted(key for t in (first, second) for batch in t.batches for key in batch)
    assert handed == [e.key for e in events]
    for event in events:
        row = _row(ledger, event.key)
        assert (row.delivery_state, row.delivery_attempts) == ("delivered", 1)
