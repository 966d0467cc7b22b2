"""A response's stream events: where a running response puts them, how a reader follows them.

``EventSink`` is where the runner (``gateway.responses``) puts each event: ``EventWriter``
stores a background response's events in order, batching what arrives while the previous
batch is being written (a batch the row refuses, because the row is no longer its
runner's, stops the run); a non-background stream's sink sends them straight to its client.
``follow`` reads a stored response's events after a sequence number and then the new ones
as they come, woken by the service's change signal (its own appends and other servers'
pokes) or a slow poll, until the row is terminal.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

from agent.messages import JSONObject
from delivery.responses_backend import TERMINAL, ResponseEvent, ResponsesBackend

__all__ = ["EventSink", "EventWriter", "NoSink", "follow"]

Batch = list[tuple[str, str]]


class EventSink(Protocol):
    """Where a running response's events go: stored (background) or sent (a stream)."""

    def add(self, type_: str, data: JSONObject) -> None: ...

    async def settle(self) -> None:
        """Return once everything added so far is stored (or sent)."""


class NoSink:
    """A non-background response answered as one JSON object: its events go nowhere."""

    def add(self, type_: str, data: JSONObject) -> None:
        pass

    async def settle(self) -> None:
        pass


class EventWriter:
    """Stores events through ``append`` (False: the row refused them), in order."""

    def __init__(self, append: Callable[[Batch], Awaitable[bool]]) -> None:
        self._append = append
        self._pending: Batch = []
        self._flusher: asyncio.Task[None] | None = None
        self._runner = asyncio.current_task()

    def add(self, type_: str, data: JSONObject) -> None:
        self._pending.append((type_, json.dumps(data, ensure_ascii=False, separators=(",", ":"))))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())

    async def _flush(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            if not await self._append(batch) and self._runner is not None:
                self._runner.cancel()  # the row is not this run's any more
                return

    async def settle(self) -> None:
        if self._flusher is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher


async def follow(
    store: ResponsesBackend,
    changed: Callable[[], asyncio.Event],
    response_id: str,
    after: int,
    *,
    poll_seconds: float,
    keepalive_seconds: float,
) -> AsyncIterator[ResponseEvent | None]:
    """The stored events after ``after``, then the new ones as they come, until the row is
    terminal (or gone). None now and then while nothing happens (a keep-alive).
    ``changed()`` is the event the next change sets."""
    idle = 0.0
    while True:
        tick = changed()  # taken before the read: a change meanwhile is not missed
        events = await asyncio.to_thread(store.events_after, response_id, after, 500)
        for event in events:
            yield event
            after = event.seq
        if events:
            idle = 0.0
            continue
        row = await asyncio.to_thread(store.get, response_id)
        if row is None or row.status in TERMINAL:
            # A terminal status is stored with its last events, in one transaction.
            for event in await asyncio.to_thread(store.events_after, response_id, after, 10_000):
                yield event
            return
        started = time.monotonic()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(tick.wait(), poll_seconds)
        idle += time.monotonic() - started
        if idle >= keepalive_seconds:
            idle = 0.0
            yield None
