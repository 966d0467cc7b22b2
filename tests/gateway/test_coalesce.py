"""The Coalescer alone: what arrives together is one batch, what arrives during a flush is the
next one, a result offered twice is gathered once, sessions are independent, and a shutdown
answers every waiter."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

import pytest

from gateway.coalesce import Coalescer


class Recorder:
    def __init__(self) -> None:
        self.batches: list[tuple[str, list[str]]] = []
        self.hold: asyncio.Event | None = None
        self.entered = asyncio.Event()

    async def flush(self, session_id: str, items: Sequence[str]) -> Mapping[str, str]:
        self.batches.append((session_id, list(items)))
        self.entered.set()
        if self.hold is not None:
            await self.hold.wait()
        # Keys are the items' first letter ("a1" and "a2" are two offers of row "a").
        return {item[:1]: f"done:{len(items)}" for item in items}


async def test_items_added_together_are_one_batch_and_each_gets_its_outcome() -> None:
    rec = Recorder()
    batches: Coalescer[str, str] = Coalescer(rec.flush, window=0, missing="held")
    outcomes = await asyncio.gather(*(batches.add("s1", k, k) for k in ("a", "b", "c")))
    assert outcomes == ["done:3"] * 3
    assert rec.batches == [("s1", ["a", "b", "c"])]


async def test_what_arrives_during_a_flush_is_the_next_batch() -> None:
    rec = Recorder()
    rec.hold = asyncio.Event()
    batches: Coalescer[str, str] = Coalescer(rec.flush, window=0, missing="held")
    first = asyncio.create_task(batches.add("s1", "a", "a"))
    await rec.entered.wait()
    later = [asyncio.create_task(batches.add("s1", k, k)) for k in ("b", "c")]
    await asyncio.sleep(0)
    assert batches.waiting("s1") == 2
    rec.hold.set()
    assert await first == "done:1"
    assert await asyncio.gather(*later) == ["done:2", "done:2"]
    assert rec.batches == [("s1", ["a"]), ("s1", ["b", "c"])]


async def test_the_same_key_offered_twice_is_gathered_once() -> None:
    rec = Recorder()
    batches: Coalescer[str, str] = Coalescer(rec.flush, window=0, missing="held")
    outcomes = await asyncio.gather(batches.add("s1", "a", "a1"), batches.add("s1", "a", "a2"))
    assert outcomes == ["done:1", "done:1"]
    assert rec.batches == [("s1", ["a2"])]  # the newest offer of the row


async def test_sessions_are_batched_apart() -> None:
    rec = Recorder()
    batches: Coalescer[str, str] = Coalescer(rec.flush, window=0, missing="held")
    await asyncio.gather(batches.add("s1", "a", "a"), batches.add("s2", "b", "b"))
    assert sorted(rec.batches) == [("s1", ["a"]), ("s2", ["b"])]


async def test_a_failing_flush_and_a_shutdown_answer_every_waiter() -> None:
    async def broken(session_id: str, items: Sequence[str]) -> Mapping[str, str]:
        raise RuntimeError("boom")

    batches: Coalescer[str, str] = Coalescer(broken, window=0, missing="held")
    assert await batches.add("s1", "a", "a") == "held"

    rec = Recorder()
    waiting: Coalescer[str, str] = Coalescer(rec.flush, window=60, missing="held")
    task = asyncio.create_task(waiting.add("s1", "a", "a"))
    await asyncio.sleep(0)
    await waiting.close(0)
    assert await task == "held" and rec.batches == []


def test_a_negative_window_is_refused() -> None:
    with pytest.raises(ValueError):
        Coalescer(Recorder().flush, window=-1, missing="held")


async def test_a_lone_result_is_flushed_without_waiting_out_the_window() -> None:
    """Nothing else of the session runs: no sibling can join, so an hour's window is not
    waited (were it, this would hang instead of passing)."""
    rec = Recorder()
    asked: list[str] = []

    def siblings(session_id: str, batch: frozenset[str]) -> bool:
        asked.append(session_id)
        assert batch == {"a"}  # the row of the result itself is no sibling
        return False

    batches: Coalescer[str, str] = Coalescer(
        rec.flush, window=3600, missing="held", siblings=siblings
    )
    assert await batches.add("s1", "a", "a") == "done:1"
    assert rec.batches == [("s1", ["a"])] and asked == ["s1"]


async def test_the_window_applies_while_siblings_still_run() -> None:
    rec = Recorder()
    running = {"s1"}
    batches: Coalescer[str, str] = Coalescer(
        rec.flush, window=3600, missing="held", siblings=lambda s, batch: s in running
    )
    first = asyncio.create_task(batches.add("s1", "a", "a"))
    for _ in range(20):  # the check runs on a thread: let it answer
        await asyncio.sleep(0.01)
    assert batches.waiting("s1") == 1 and rec.batches == []  # waiting for its sibling
    second = asyncio.create_task(batches.add("s1", "b", "b"))
    await asyncio.sleep(0)
    await batches.close(0)  # shutdown: both answered, nothing flushed (the ledger re-offers)
    assert await first == "held" and await second == "held"
    assert rec.batches == []
