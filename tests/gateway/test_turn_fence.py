"""``gateway.turns.fence``: a turn's cancel and its store, whichever comes first wins."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from agent.loop import Agent
from agent.providers.demo import DemoModel
from agent.tools import ToolRegistry
from gateway.config import Platform
from gateway.session import SessionSource
from gateway.turns.fence import TurnFence, TurnTask, finish_despite_cancel
from gateway.turns.service import StartedTurn, TurnRequest, TurnService, agent_turn_runner
from tests.sessions._support import make_session
from tests.stores import session_file_store


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


def _plain_task(coro: Coroutine[Any, Any, str]) -> asyncio.Task[str]:
    return asyncio.create_task(coro)


def _turn_task(coro: Coroutine[Any, Any, str]) -> asyncio.Task[str]:
    return TurnTask(coro, loop=asyncio.get_running_loop())


# Any task (the general path: the step in a task of its own), and a turn service's own
# ``TurnTask`` (the step in the turn's task, its cancels held off).
@pytest.mark.parametrize("start", [_plain_task, _turn_task], ids=["task", "turn_task"])
async def test_a_cancel_once_the_store_began_loses_and_the_store_ends(
    start: Callable[[Coroutine[Any, Any, str]], asyncio.Task[str]],
) -> None:
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

    task = start(turn())
    fence.bind(task)
    await began.wait()
    assert fence.cancel() is False  # already completing
    assert task.cancel() is True  # anyone else's cancel (a shutdown) waits for the store too
    release.set()
    assert await task == "done"
    assert stored == ["reply"] and fence.state == "stored" and task.cancelling() == 0


async def test_a_cancel_pending_before_the_step_of_a_turn_task_still_lets_the_step_end() -> None:
    stored: list[str] = []

    async def store() -> str:
        await asyncio.sleep(0)  # where a pending cancel would land
        stored.append("reply")
        return "done"

    async def turn() -> str:
        # A cancel asked while the turn was between steps, before it entered the store.
        asyncio.current_task().cancel()  # type: ignore[union-attr]
        return await finish_despite_cancel(store())

    task = _turn_task(turn())
    assert await task == "done"
    assert stored == ["reply"] and task.cancelling() == 0


async def test_a_turn_task_is_cancelled_as_any_task_outside_a_step() -> None:
    async def model() -> str:
        await asyncio.sleep(3600)
        return "never"

    task = _turn_task(model())
    await asyncio.sleep(0)
    assert task.cancel() is True
    with pytest.raises(asyncio.CancelledError):
        await task


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


async def test_a_turn_cancelled_before_its_first_step_leaves_nothing_held(
    tmp_path: Path,
) -> None:
    """A Stop in the same loop iteration as the start cancels the turn's task before its
    coroutine began, so that coroutine's own cleanup never runs: the turn's end does it
    instead. Its slot, its session's lease and its idempotency key are free again, and its
    stream ends."""
    store = session_file_store(tmp_path / "sessions.db")
    make_session(store, "s1", source=SessionSource(Platform.API_SERVER, chat_id="s1"))
    service = TurnService(
        store,
        agent_turn_runner(Agent(DemoModel(delay_seconds=0), ToolRegistry())),
        render=lambda result: {"content": str(result.content or "")},
        max_concurrent_runs=1,
        hold_sessions=True,
    )
    request = TurnRequest("s1", [{"role": "user", "content": "hi"}], "k1", stream=True)
    started = await service.start(request)
    assert isinstance(started, StartedTurn)
    assert started.cancel()
    with pytest.raises(asyncio.CancelledError):
        await started.task
    await service.drain(5.0)  # what the turn's end settles is awaited with the turns
    assert service.active_runs == 0
    assert started.deltas is not None and started.deltas.get_nowait() is None
    again = await service.start(request)  # the same session, the same key
    assert isinstance(again, StartedTurn)
    assert (await again.task)["content"]
    await service.drain(5.0)
    assert service.active_runs == 0
