"""``gateway.turns.gate.first_answer``: the caller waits for the turn's answer; a caller
that goes away (cancelled) leaves the turn running, and its end is still stored."""

from __future__ import annotations

import asyncio

import pytest

from gateway.turns.gate import first_answer


async def test_the_answer_and_the_failure_of_the_turn_reach_the_caller() -> None:
    release = asyncio.Event()

    async def turn() -> dict:
        await release.wait()
        return {"answer": 42}

    task = asyncio.create_task(turn())
    waiting = asyncio.create_task(first_answer(task, None))
    await asyncio.sleep(0)
    release.set()
    assert await waiting == {"answer": 42}
    assert await first_answer(task, None) == {"answer": 42}  # a finished turn: at once

    async def failing() -> dict:
        raise RuntimeError("the model failed")

    with pytest.raises(RuntimeError, match="the model failed"):
        await first_answer(asyncio.create_task(failing()), None)


async def test_a_cancelled_caller_leaves_the_turn_running() -> None:
    release = asyncio.Event()
    ended: list[str] = []

    async def turn() -> dict:
        await release.wait()
        ended.append("stored")
        return {"answer": 1}

    task = asyncio.create_task(turn())
    waiting = asyncio.create_task(first_answer(task, None))
    await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert not task.cancelled() and not task.done()
    release.set()
    assert await task == {"answer": 1} and ended == ["stored"]


async def test_a_turn_cancelled_elsewhere_cancels_the_wait() -> None:
    task = asyncio.create_task(asyncio.sleep(10))
    waiting = asyncio.create_task(first_answer(task, None))  # type: ignore[arg-type]
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
