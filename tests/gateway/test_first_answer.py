"""``gateway.turns.gate.first_answer``: the caller waits for the turn's answer; a caller
that goes away (cancelled) leaves the turn running, and its end is still stored."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.turns.fence import TurnTask
from gateway.turns.gate import first_answer


def _held_turn(answer: dict, ended: list[str] | None = None) -> tuple[asyncio.Event, Any]:
    """A turn's coroutine that answers ``answer`` once the event is set (noting "stored" in
    ``ended``), and that event."""
    release = asyncio.Event()

    async def turn() -> dict:
        await release.wait()
        if ended is not None:
            ended.append("stored")
        return answer

    return release, turn()


def _turn_task(coro: Any) -> TurnTask[Any]:
    """A ``TurnTask`` whose runner resolves its waiter in its done callback, as the turn
    service's does."""
    task: TurnTask[Any] = TurnTask(coro, loop=asyncio.get_running_loop())
    task.add_done_callback(lambda t: t.resolve_waiter())
    task.resolves_waiter = True
    return task


async def test_the_answer_and_the_failure_of_the_turn_reach_the_caller() -> None:
    release, turn = _held_turn({"answer": 42})
    task = asyncio.create_task(turn)
    waiting = asyncio.create_task(first_answer(task, None))
    await asyncio.sleep(0)
    release.set()
    assert await waiting == {"answer": 42}
    assert await first_answer(task, None) == {"answer": 42}  # a finished turn: at once

    async def failing() -> dict:
        raise RuntimeError("the model failed")

    with pytest.raises(RuntimeError, match="the model failed"):
        await first_answer(asyncio.create_task(failing()), None)


@pytest.mark.parametrize("runner", ["plain task", "turn task"])
async def test_a_cancelled_caller_leaves_the_turn_running(runner: str) -> None:
    """Whether the caller waits the general way or on a ``TurnTask``'s own waiter, its
    cancellation leaves the turn running, and the turn's end resolves nothing it left."""
    ended: list[str] = []
    release, turn = _held_turn({"answer": 1}, ended)
    task = asyncio.create_task(turn) if runner == "plain task" else _turn_task(turn)
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


async def test_a_turn_task_wakes_its_callers_from_its_runners_callback() -> None:
    release, turn = _held_turn({"answer": 7})
    task = _turn_task(turn)
    first = asyncio.create_task(first_answer(task, None))
    await asyncio.sleep(0)
    assert task.waiter is not None  # the first caller waits on the task's own waiter
    second = asyncio.create_task(first_answer(task, None))  # the general way
    await asyncio.sleep(0)
    release.set()
    assert await first == {"answer": 7} and await second == {"answer": 7}

    async def failing() -> dict:
        raise RuntimeError("the model failed")

    with pytest.raises(RuntimeError, match="the model failed"):
        await first_answer(_turn_task(failing()), None)


async def test_a_turn_task_whose_runner_resolves_nothing_is_waited_for_the_general_way() -> None:
    async def turn() -> dict:
        await asyncio.sleep(0.01)
        return {"answer": 2}

    task: TurnTask[Any] = TurnTask(turn(), loop=asyncio.get_running_loop())
    assert await first_answer(task, None) == {"answer": 2}
    assert task.waiter is None
