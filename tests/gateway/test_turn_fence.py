"""``gateway.turns.fence``: a turn's cancel and its store, whichever comes first wins."""

from __future__ import annotations

import asyncio

import pytest

from gateway.turns.fence import TurnFence, finish_despite_cancel


async def test_a_cancel_before_the_store_wins_and_nothing_is_stored() -> None:
    fence = TurnFence()
    stored: list[str] = []

    async def turn() -> None:
        await asyncio.sleep(3600)  # the model, cancelled before it answers
        if await fence.enter_store():
            stored.append("reply")

    task = asyncio.create_task(turn())
    fence.bind(task)
    await asyncio.sleep(0)
    assert fence.cancel() is True
    with pytest.raises(asyncio.CancelledError):
        await task
    assert stored == [] and fence.state == "cancelled"
    assert fence.cancel() is True  # said again: still cancelled


async def test_a_cancel_once_the_store_began_loses_and_the_store_ends() -> None:
    began, release = asyncio.Event(), asyncio.Event()
    fence = TurnFence()
    stored: list[str] = []

    async def store() -> str:
        began.set()
        await release.wait()
        stored.append("reply")
        return "done"

    async def turn() -> str:
        assert await fence.enter_store()
        answer = await finish_despite_cancel(store())
        fence.stored()
        return answer

    task = asyncio.create_task(turn())
    fence.bind(task)
    await began.wait()
    assert fence.cancel() is False  # already completing
    task.cancel()  # anyone else's cancel (a shutdown) waits for the store too
    release.set()
    assert await task == "done"
    assert stored == ["reply"] and fence.state == "stored" and task.cancelling() == 0


async def test_a_claim_refused_in_the_store_means_nothing_is_stored() -> None:
    async def refused() -> bool:
        return False  # a cancel moved the row first, through another server

    fence = TurnFence(refused)
    assert await fence.enter_store() is False
    assert fence.state == "cancelled"


async def test_a_failing_step_raises_its_own_error() -> None:
    async def broken() -> None:
        raise ValueError("disk full")

    with pytest.raises(ValueError, match="disk full"):
        await finish_despite_cancel(broken())
