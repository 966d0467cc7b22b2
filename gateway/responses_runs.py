"""The machinery under ``gateway.responses.ResponsesService``: its reads and poking writes
on the responses store, the terminal hook, and this server's background runs (claiming a
queued row, running it under a renewed lease, ending a row whose server died ``failed``).

A base of ``ResponsesService``, which keeps the public operations (create, run, cancel,
delete, follow) and the worker's sweep; these read the attributes declared below.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol, TypeVar

from delivery.identity import holder_is_dead
from delivery.notifier import Subscription
from delivery.responses_backend import Change, ResponseRow, ResponsesBackend
from gateway.openai.response_object import body_of, partial_output
from gateway.openai.responses_wire import ResponsesRequest
from gateway.response_events import EventSink, EventWriter

__all__ = ["ResponsesRuns", "TerminalHook", "dumps"]

logger = logging.getLogger("gateway.responses")

T = TypeVar("T")


class TerminalHook(Protocol):
    """Told once a response reached a terminal state (``response.completed`` and so on); what
    it returns (the webhook sender's delivery id) is not used."""

    def __call__(self, response_id: str, event_type: str) -> object: ...


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class ResponsesRuns:
    """Store access, the terminal hook and background runs (see the module docstring)."""

    store: ResponsesBackend
    owner: str
    lease_seconds: float
    hook_foreground: bool
    _on_terminal: TerminalHook | None
    _running: dict[str, asyncio.Task[Any]]
    _finishing: set[str]
    _claimed: set[str]
    _storing: set[str]
    _tick: asyncio.Event
    _wake: asyncio.Event
    _pokes: Subscription | None

    async def _execute(self, row: ResponseRow, sink: EventSink) -> dict[str, Any]:
        raise NotImplementedError  # the service runs the turn

    def _poked(self) -> None:
        if self._pokes is not None:
            self._pokes.drain()
        self._changed()
        self._wake.set()

    def _changed(self) -> None:
        tick, self._tick = self._tick, asyncio.Event()
        tick.set()

    async def _db(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def _write(self, fn: Callable[..., T], *args: Any, poke: bool = True, **kwargs: Any) -> T:
        """A write, then (``poke``) the pokes: this server's readers and every other server.
        A non-background response's own writes poke nobody: nothing follows its row."""
        if not poke:
            return await asyncio.to_thread(fn, *args, **kwargs)

        def write_and_poke() -> T:
            result = fn(*args, **kwargs)
            self.store.notifier.notify()
            return result

        result = await asyncio.to_thread(write_and_poke)
        self._changed()
        return result

    def _quiet(self, row: ResponseRow) -> bool:
        """No terminal hook for ``row``: none is set, or the row is a foreground response
        and ``hook_foreground`` is off (OpenAI sends webhooks for background responses
        only). A quiet row is stored as notified, in the same write as its end."""
        return self._on_terminal is None or not (row.background or self.hook_foreground)

    async def _told(self, response_id: str, event_type: str) -> None:
        """Run the terminal hook, then mark the row notified."""
        if self._on_terminal is not None:
            try:
                await asyncio.to_thread(self._on_terminal, response_id, event_type)
            except Exception:
                logger.exception("the terminal hook failed for %s (offered again)", response_id)
                return
        await self._db(self.store.mark_notified, response_id)

    def _ran(self, response_id: str) -> None:
        """A run ended: its turn's slot is free, so a queued response may be claimed now."""
        self._running.pop(response_id, None)
        self._claimed.discard(response_id)
        self._storing.discard(response_id)
        self._finishing.discard(response_id)
        self._wake.set()

    async def _keep_lease(self, response_id: str, runner: asyncio.Task[Any] | None) -> None:
        """Renew the lease; a row that is no longer ours (cancelled, deleted, taken over)
        stops its runner."""
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            ours = await self._db(
                self.store.renew, response_id, self.owner, time.time() + self.lease_seconds
            )
            if not ours and runner is not None and response_id not in self._finishing:
                runner.cancel()
                return

    async def _run_background(self, row: ResponseRow) -> None:
        async def append(batch: list[tuple[str, str]]) -> bool:
            return await self._write(self.store.append_events, row.id, self.owner, batch)

        writer = EventWriter(append)
        try:
            await self._execute(row, writer)
        except asyncio.CancelledError:
            pass
        finally:
            await writer.settle()

    async def _stop_lost_runs(self, seen_ours: set[str]) -> None:
        """Stop the runs whose rows are no longer this server's to run: cancelled, deleted
        or taken over through another server (a poke brings the sweep here at once)."""
        for response_id, task in list(self._running.items()):
            if response_id in seen_ours or response_id in self._finishing:
                continue
            row = await self._db(self.store.get, response_id)
            if row is None or row.status != "in_progress" or row.owner != self.owner:
                task.cancel()

    def _owner_dead(self, owner: str | None) -> bool:
        """The owner is a process on this host that is gone (no need to wait for its lease)."""
        return not owner or holder_is_dead(owner.partition("#")[0])

    async def _claim(self, row: ResponseRow) -> None:
        body = {**json.loads(row.body), "status": "in_progress"}
        claimed = await self._write(
            self.store.transition,
            row.id,
            expect=("queued",),
            owner=None,
            change=Change("in_progress", dumps(body), self.owner, time.time() + self.lease_seconds),
            events=[("response.in_progress", dumps({"response": body}))],
            check_owner=False,
        )
        if not claimed:
            return
        mine = replace(row, status="in_progress", owner=self.owner, body=dumps(body))
        self._claimed.add(row.id)  # room in this server's pool until the run ends
        task = asyncio.create_task(self._run_background(mine))
        self._running[row.id] = task
        task.add_done_callback(lambda _: self._ran(row.id))

    async def _end_abandoned(self, row: ResponseRow) -> None:
        request = ResponsesRequest.from_json(row.request)
        now = time.time()
        reason = (
            "the server running this response stopped before it finished "
            f"({row.owner}); it was not run again because part of its output may already "
            "have been streamed. Send the request again."
        )
        # What its stream had shown stays in the object, the message ``incomplete``.
        stored = await self._db(self.store.events_after, row.id, -1, 100_000)
        body = body_of(
            row.id,
            request,
            status="failed",
            created_at=row.created_at,
            output=partial_output((event.type, json.loads(event.data)) for event in stored),
            error=reason,
            completed_at=now,
        )
        ended = await self._write(
            self.store.transition,
            row.id,
            expect=("in_progress",),
            owner=row.owner,
            change=Change("failed", dumps(body), completed_at=now, notified=self._quiet(row)),
            events=[("response.failed", dumps({"response": body}))] if row.background else None,
        )
        if ended:
            logger.warning("response %s ended failed: its server %s stopped", row.id, row.owner)
            if not self._quiet(row):
                await self._told(row.id, "response.failed")
