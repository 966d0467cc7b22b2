"""The order of a turn's cancel and its store: whichever comes first wins, never both.

A turn whose reply is ready enters its store through its ``TurnFence``; a cancel (the web
UI's Stop, a Responses API cancel) goes through the same fence. A cancel before the store
began cancels the turn and nothing of its reply is stored; a cancel once the store began
loses: the store runs to its end and the turn answers as completed (the caller says
"already completed"). Within one process the fence's state decides (both sides run on the
event loop, so no lock is needed); where a cancel may come from another server (a stored
response), the surface passes ``claim``: a compare-and-set in the store that the cancel's
own compare-and-set excludes, run as the first step of the store.

``finish_despite_cancel`` runs a step that must not be cut in two (the store after the
fence): a cancel of the task that lands meanwhile waits for the step and is then withdrawn.
In a ``TurnTask`` (the task a turn service runs each turn in) the step runs in that task
itself, with its cancels held off, instead of in a second task: one task per turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar

__all__ = ["TurnFence", "TurnTask", "finish_despite_cancel"]

T = TypeVar("T")

FenceState = Literal["running", "storing", "stored", "cancelled"]


class TurnTask(asyncio.Task[T]):
    """A task whose cancels ``finish_despite_cancel`` can hold off while it runs a step:
    asked meanwhile, a cancel is answered as accepted and dropped, as the general path's
    ``uncancel`` would withdraw it once the step ended, without a second task to run the
    step in (or a shield around it)."""

    _holding = 0  # steps running that no cancel may cut
    # The one caller waiting for the turn's end (``gateway.turns.gate.first_answer``) waits
    # on ``waiter`` when the task's runner resolves it in the done callback it has anyway
    # (``resolves_waiter``: the turn service's), instead of adding a done callback of its
    # own: each is a loop step, with its handle, when the turn ends.
    resolves_waiter = False
    waiter: asyncio.Future[None] | None = None

    def take_waiter(self) -> asyncio.Future[None] | None:
        """A new future that the task's end resolves, or None where the task's runner does
        not resolve one or another caller took it (they wait the general way)."""
        if not self.resolves_waiter or self.waiter is not None:
            return None
        waiter: asyncio.Future[None] = self.get_loop().create_future()
        self.waiter = waiter
        return waiter

    def resolve_waiter(self) -> None:
        """Called by the runner's done callback: wakes the caller of ``take_waiter``."""
        waiter = self.waiter
        if waiter is not None and not waiter.done():  # not cancelled with its caller
            waiter.set_result(None)

    def cancel(self, msg: Any | None = None) -> bool:
        if self._holding:
            return not self.done()
        return super().cancel(msg)


async def finish_despite_cancel(step: Awaitable[T]) -> T:
    """Await ``step`` to its end even when the current task is cancelled meanwhile; those
    cancels are withdrawn (``Task.uncancel``): the step's outcome stands."""
    task = asyncio.current_task()
    # A ``TurnTask`` that no cancel has reached yet holds cancels off while it runs the step
    # itself; one with a cancel pending (it would land inside the step) takes the general
    # path, which shields the step in a task of its own.
    if isinstance(task, TurnTask) and not task.cancelling():
        task._holding += 1
        try:
            return await step
        finally:
            task._holding -= 1
    inner = asyncio.ensure_future(step)
    cancels = 0
    while not inner.done():
        try:
            await asyncio.shield(inner)
        except asyncio.CancelledError:
            if inner.done():
                break
            cancels += 1
        except BaseException:
            break  # the step's own failure: ``result()`` raises it below
    if task is not None:
        for _ in range(cancels):
            task.uncancel()
    return inner.result()


class TurnFence:
    """One turn's cancel/store order (see the module docstring)."""

    def __init__(self, claim: Callable[[], Awaitable[bool]] | None = None) -> None:
        self._claim = claim
        self._task: asyncio.Task[Any] | None = None
        self.state: FenceState = "running"
        # Set by the turn's work as it begins: a task cancelled before its first step never
        # runs its coroutine, so whatever that coroutine would release in a ``finally`` is
        # released by the task's end instead (``TurnService``).
        self.began = False

    def bind(self, task: asyncio.Task[Any]) -> None:
        """The task that runs the turn (a cancel cancels it)."""
        self._task = task

    def cancel(self) -> bool:
        """Cancel the turn unless its store began. True: cancelled (now or before), nothing
        of its reply will be stored; False: the reply is stored or being stored."""
        if self.state in ("storing", "stored"):
            return False
        if self.state == "running":
            self.state = "cancelled"
            if self._task is not None and not self._task.done():
                self._task.cancel()
        return True

    async def enter_store(self) -> bool:
        """The reply is ready: from now on a cancel loses. False when a cancel came first
        (here, or through ``claim`` in the store): nothing may be stored."""
        if self.state != "running":
            return False
        # Set before the first await: a cancel on this loop from now on answers False.
        self.state = "storing"
        if self._claim is not None:
            try:
                claimed = await finish_despite_cancel(self._claim())
            except BaseException:
                self.state = "cancelled"
                raise
            if not claimed:
                self.state = "cancelled"
                return False
        return True

    def stored(self) -> None:
        self.state = "stored"
