"""Who waits for a queued store operation, and how its outcome reaches them.

A writer (SQLite's group commit, PostgreSQL's batches) or a batched reader takes operations
from threads (a ``WriteFuture``) and from coroutines (a ``LoopWaiter``: a future of one event
loop). ``resolve`` hands a batch's outcomes back, waking each event loop once per batch
rather than once per operation.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from delivery.write_future import WriteFuture

__all__ = ["LoopWaiter", "Outcome", "Waiter", "resolve", "still_wanted"]


class LoopWaiter:
    """An operation awaited by a coroutine on ``loop``."""

    __slots__ = ("fut", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, fut: asyncio.Future[Any]) -> None:
        self.loop = loop
        self.fut = fut


Waiter = WriteFuture[Any] | LoopWaiter
Outcome = tuple[Waiter, bool, Any]


def still_wanted(waiter: Waiter) -> bool:
    # A thread's write cannot be cancelled; a coroutine's can, before it is run.
    return not isinstance(waiter, LoopWaiter) or not waiter.fut.cancelled()


def _settle_on_loop(items: list[tuple[asyncio.Future[Any], bool, Any]]) -> None:
    for fut, ok, value in items:
        if fut.done():
            continue  # cancelled meanwhile; the write itself stands
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)


def resolve(outcomes: list[Outcome]) -> None:
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], bool, Any]]] = {}
    for waiter, ok, value in outcomes:
        if isinstance(waiter, LoopWaiter):
            by_loop.setdefault(waiter.loop, []).append((waiter.fut, ok, value))
        else:
            waiter._settle(ok, value)
    for loop, items in by_loop.items():
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody awaits any more
            loop.call_soon_threadsafe(_settle_on_loop, items)
