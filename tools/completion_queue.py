"""The completion queue: the one hand-off point between finished work and its deliverers.

Worker threads put completion events (plain dicts, see SPEC.md "Completion events"); the
gateway watcher (asyncio) and other consumers take them. ``CompletionQueue`` blocks without
polling on both sides. ``EventQueue`` is the little a runtime needs of a queue (``put`` and
``get`` like ``queue.Queue``), so tests and embedders may hand it any such queue.

``shared_completion_queue`` is this process's queue; ``tools.process_registry`` exposes it
as ``process_registry.completion_queue`` and the runtime puts on it unless told otherwise.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import queue
import threading
from typing import Any, Protocol

WireEvent = dict[str, Any]
"""A completion event as it travels (the queue, the ledger's ``event`` column, plugins): a
plain dict, ``type`` plus the fields SPEC.md lists for that type. ``delivery.events`` parses
it once into the typed ``CompletionEvent`` that the rules and the deliverers read."""


class EventQueue(Protocol):
    """What a runtime needs of a completion queue: ``queue.Queue``'s ``put`` and ``get``."""

    def put(self, item: WireEvent, /) -> None: ...

    def get(self, block: bool = True, timeout: float | None = None) -> WireEvent: ...


class CompletionQueue:
    """A FIFO like ``queue.Queue`` that asyncio code can also await without polling."""

    def __init__(self) -> None:
        self._items: collections.deque[WireEvent] = collections.deque()
        self._cond = threading.Condition()
        self._async_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def put(self, item: WireEvent, block: bool = True, timeout: float | None = None) -> None:
        with self._cond:
            self._items.append(item)
            self._cond.notify()
            waiters, self._async_waiters = self._async_waiters, []
        for loop, fut in waiters:
            # A waiter only learns "look again"; the item stays here until someone takes
            # it, so a cancelled waiter can never swallow an event.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_wake, fut)

    put_nowait = put

    def get(self, block: bool = True, timeout: float | None = None) -> WireEvent:
        with self._cond:
            if not block:
                if not self._items:
                    raise queue.Empty
                return self._items.popleft()
            if not self._cond.wait_for(lambda: self._items, timeout):
                raise queue.Empty
            return self._items.popleft()

    def get_nowait(self) -> WireEvent:
        return self.get(block=False)

    async def get_async(self) -> WireEvent:
        loop = asyncio.get_running_loop()
        while True:
            with self._cond:
                if self._items:
                    return self._items.popleft()
                fut: asyncio.Future[None] = loop.create_future()
                self._async_waiters.append((loop, fut))
            await fut

    def qsize(self) -> int:
        return len(self._items)

    def empty(self) -> bool:
        return not self._items

    def drain(self) -> list[WireEvent]:
        with self._cond:
            items = list(self._items)
            self._items.clear()
            return items


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


shared_completion_queue = CompletionQueue()
"""This process's completion queue, which every consumer drains."""
