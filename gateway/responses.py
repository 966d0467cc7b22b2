"""The Responses API's runner: stored responses, run by any server sharing the store.

A response is a row (``delivery.responses_backend``) written before its work starts. Its
turn runs on the API server's turn service (``gateway.turns.service``) in the session the response
chain maps onto: a new chain gets a new session, ``previous_response_id`` continues that
response's session, so background results of the conversation are folded into the next
response exactly once, as for chat.

Background responses are queued rows. Every server runs a worker: it claims queued rows
while it has room in its own pool of ``background_concurrency`` runs (the server that took
the request is poked at once; these turns take none of the API's ``max_concurrent_runs``
slots, so queued work never refuses a chat request or a wake-up), holds
a lease on each running one (renewed every third of ``lease_seconds``), and stores every
streamed event in order. A running row whose lease ran out, or whose owner is a dead
process on this host, ends ``failed`` with a reason: part of its output may already have
been streamed and billed, so it is not silently run a second time. A cancel (or delete)
moves the row first; its runner learns it from the store (a poke, else the next renewal)
and cancels the turn, whose results are then never stored. Cancel wins only before the
store: a finished turn's store begins with a compare-and-set of the row to its storing
owner (``storing_owner``, the turn's ``before_store``), which the cancel's own
compare-and-set excludes; a cancel that finds the row storing waits for its end and answers
with it (``completed``: already completed). The background units the turn dispatched
carry the response's id (``RESPONSE_ORIGIN``) and are cancelled with it.

Streams follow the store: a reader replays the stored events after its ``starting_after``
and then waits for pokes (this server's appends, the store's notifier for the others;
a slow poll as the fallback) until the row is terminal. Non-background responses run in
the request, stream straight from the turn and store only the final object.

At each terminal state of a background response (of a foreground one too with
``hook_foreground``: OpenAI sends webhooks for background responses only)
``on_terminal(response_id, event_type)`` runs (webhooks) after the state is stored; a row
that ended without it (a crash in between) is offered again by the
next sweep, so the hook runs at least once. Retention is not this service's: the
server's retention scheduler (``delivery.retention``, kind ``stored_responses``, one server
at a time) prunes terminal rows older than ``[responses] keep_days``.

The store access, the terminal hook and the claiming, leasing and abandoning of background
runs are ``gateway.responses_runs``; this module keeps the operations and the sweep.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from agent.messages import JSONObject
from agent.tools import ToolProgress
from delivery.identity import current_identity
from delivery.ids import new_token
from delivery.notifier import Subscription
from delivery.responses_backend import (
    TERMINAL,
    Change,
    QueueCaps,
    QueueFull,
    ResponseEvent,
    ResponseRow,
    ResponsesBackend,
    is_storing,
    storing_owner,
)
from gateway.config import Platform
from gateway.openai.response_object import (
    INCOMPLETE_REASONS,
    Output,
    body_of,
    output_events,
    partial_output,
    terminal_event,
)
from gateway.openai.responses_calls import calls_of, function_call_events, function_call_items
from gateway.openai.responses_wire import ResponsesRequest, new_response_id
from gateway.openai.wire import completion_text, finish_reason_of
from gateway.response_events import EventSink, NoSink, follow
from gateway.responses_runs import ResponsesRuns, TerminalHook, dumps
from gateway.responses_tools import client_tools_of
from gateway.session import SessionSource
from gateway.turns.conversation import well_formed
from gateway.turns.fence import finish_despite_cancel
from gateway.turns.service import StartedTurn, TurnError, TurnRequest, TurnService
from tools.delegation_runtime import RESPONSE_ORIGIN, get_runtime, runtime_is_open

__all__ = [
    "Created",
    "EventSink",
    "PreviousNotUsable",
    "QueueFull",
    "ResponsesService",
    "TerminalHook",
]

logger = logging.getLogger(__name__)
_SWEEP_BATCH = 100
_SWEEP_GAP_SECONDS = 0.25
# A terminal row still unnotified this long after it ended had its hook interrupted.
_HOOK_RETRY_AFTER_SECONDS = 30.0
_HOOK_CHECK_EVERY_SECONDS = 10.0


class PreviousNotUsable(Exception):
    """``previous_response_id`` names no stored response, or one that has not ended."""

    def __init__(self, message: str, *, missing: bool) -> None:
        super().__init__(message)
        self.missing = missing


@dataclass(frozen=True)
class Created:
    """A new row, or (``replayed``) the row an earlier request with the same key made."""

    row: ResponseRow
    replayed: bool = False


BY_RESPONSE = "the API client that cancelled the response which started it"


class ResponsesService(ResponsesRuns):
    """Creates, runs, cancels and streams stored responses (see the module docstring)."""

    def __init__(
        self,
        store: ResponsesBackend,
        turns: TurnService,
        *,
        on_terminal: TerminalHook | None = None,
        lease_seconds: float = 30.0,
        poll_seconds: float = 1.0,
        background_concurrency: int = 4,
        max_queued: int = 1000,
        max_queued_per_key: int = 100,
        hook_foreground: bool = False,
    ) -> None:
        if background_concurrency < 1:
            raise ValueError("background_concurrency must be at least 1")
        self.store = store
        self.turns = turns
        self._on_terminal = on_terminal
        # The terminal hook runs for background responses; for foreground ones too only
        # when asked (``[webhooks] foreground``).
        self.hook_foreground = hook_foreground
        self.lease_seconds = lease_seconds
        self.poll_seconds = poll_seconds
        self.background_concurrency = background_concurrency
        self.caps = QueueCaps(per_caller=max_queued_per_key, total=max_queued)
        # The process identity the ledger's claims use (host, boot, pid, start time), so a
        # dead owner on this host is recognised at once, and a reused pid is not mistaken
        # for it; the token tells this service apart from another in the same process.
        self.owner = f"{current_identity()}#{new_token()[:8]}"
        self._running: dict[str, asyncio.Task[Any]] = {}
        # Runs storing their end: the row moves under them, which must not stop them.
        self._finishing: set[str] = set()
        self._tick = asyncio.Event()  # replaced at each change: a broadcast to readers
        self._wake = asyncio.Event()  # the worker's: look at the store now
        self._pokes: Subscription | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._worker: asyncio.Task[None] | None = None
        self._stopping = False
        self._paused = False  # draining: no new claims
        self._stopped = False
        self._last_hook_check = 0.0
        self._claimed: set[str] = set()  # background runs of this server (its own pool)
        self._storing: set[str] = set()  # runs past their store's fence (storing owner)

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._pokes = await asyncio.to_thread(self.store.notifier.subscribe)
        if self._pokes is not None:
            self._loop.add_reader(self._pokes.fileno(), self._poked)
        self._worker = asyncio.create_task(self._work())

    def pause(self) -> None:
        """Claim no more queued responses (the server is draining): they stay queued for
        another server, or for this one once restarted."""
        self._paused = True

    async def stop(self, grace_seconds: float = 10.0) -> None:
        """Stop claiming; give running responses ``grace_seconds``, then end the rest failed;
        close the store. A second call does nothing."""
        if self._stopped:
            return
        self._stopped = True
        self._stopping = True
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        running = list(self._running.values())
        if running:
            _, late = await asyncio.wait(running, timeout=grace_seconds)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late)
        if self._pokes is not None and self._loop is not None:
            self._loop.remove_reader(self._pokes.fileno())
            self._pokes.close()
            self._pokes = None
        await asyncio.to_thread(self.store.close)

    # ----------------------------------------------------------------- creating

    async def create(
        self,
        request: ResponsesRequest,
        *,
        idempotency_key: str | None,
        fingerprint: str | None,
        caller: str | None = None,
    ) -> Created:
        """Write the row (queued when background, else in_progress and owned here). A
        background one beyond the queue's caps is refused (``QueueFull``): ``caller``'s own
        queued rows (``max_queued_per_key``), every caller's (``max_queued``), counted by
        the store in the insert's own transaction."""
        session_id = "sess_" + new_token()[:32]
        if request.previous_response_id is not None:
            previous = await self._db(self.store.get, request.previous_response_id)
            if previous is None:
                raise PreviousNotUsable(
                    f"previous response {request.previous_response_id!r} not found", missing=True
                )
            if previous.status not in TERMINAL:
                raise PreviousNotUsable(
                    f"previous response {request.previous_response_id!r} is still "
                    f"{previous.status}; continue it once it has ended",
                    missing=False,
                )
            session_id = previous.session_id
        elif request.conversation is not None:
            # A conversation is a session (``gateway.conversations``): the route found it.
            session_id = request.conversation
        now = time.time()
        response_id = new_response_id()
        status = "queued" if request.background else "in_progress"
        body = body_of(response_id, request, status=status, created_at=now)
        row = ResponseRow(
            id=response_id,
            status=status,
            background=request.background,
            session_id=session_id,
            request=request.to_json(),
            body=dumps(body),
            created_at=now,
            updated_at=now,
            previous_response_id=request.previous_response_id,
            owner=None if request.background else self.owner,
            lease_until=0.0 if request.background else now + self.lease_seconds,
            idempotency_key=idempotency_key,
            fingerprint=fingerprint,
            notified=not request.store,
            caller=caller,
        )
        first: list[tuple[str, str]] = []
        if request.background:
            first = [
                ("response.created", dumps({"response": body})),
                ("response.queued", dumps({"response": body})),
            ]
        caps = self.caps if request.background else None
        stored = await self._write(self.store.insert, row, first, caps, poke=request.background)
        if stored.id != row.id:
            return Created(stored, replayed=True)
        if request.background and not (self._stopping or self._paused):
            if self._has_room():
                await self._claim(stored)  # this server first; the others' sweeps otherwise
            else:
                self._wake.set()
        return Created(stored)

    async def get(self, response_id: str) -> ResponseRow | None:
        return await self._db(self.store.get, response_id)

    # ----------------------------------------------------------------- running

    async def run_inline(self, row: ResponseRow, sink: EventSink | None = None) -> dict[str, Any]:
        """Run a non-background response here (it is in_progress and ours); ``sink`` gets
        each event as it happens. Runs to the end even when the caller goes away."""
        task = asyncio.create_task(self._execute(row, sink or NoSink()))
        self._running[row.id] = task
        task.add_done_callback(lambda _: self._ran(row.id))
        return await asyncio.shield(task)

    def _has_room(self) -> bool:
        """This server's pool of background runs can take one more."""
        return len(self._claimed) < self.background_concurrency

    async def _execute(self, row: ResponseRow, sink: EventSink) -> dict[str, Any]:
        request = ResponsesRequest.from_json(row.request)
        out = Output("msg_" + new_token()[:32])
        pieces: list[str] = []
        lease = asyncio.create_task(self._keep_lease(row.id, asyncio.current_task()))
        turn_task: asyncio.Task[dict[str, Any]] | None = None
        opened = False
        # Work the turn dispatches records this response: cancelling it cancels that work.
        origin = RESPONSE_ORIGIN.set(row.id)
        try:
            try:
                started = await self.turns.start(
                    TurnRequest(
                        session_id=row.session_id,
                        messages=request.messages,
                        # The owner key (a keyless server's client) holds the session too.
                        create=SessionSource(
                            platform=Platform.API_SERVER,
                            chat_id=row.session_id,
                            user_id=request.owner,
                        ),
                        stream=True,
                        **client_tools_of(request, self.turns.tool_names()),
                        before_store=lambda: self._enter_store(row),
                        own_slot=row.background,
                    )
                )
            finally:
                RESPONSE_ORIGIN.reset(origin)
            # No idempotency key goes to the turn service, so it never answers a replay.
            assert isinstance(started, StartedTurn) and started.deltas is not None
            turn_task, deltas = started.task, started.deltas
            while (piece := await deltas.get()) is not None:
                if isinstance(piece, ToolProgress) or not piece:
                    continue
                # A model may send a lone surrogate: repaired before it is stored or sent.
                piece = well_formed(piece)
                pieces.append(piece)
                for event in output_events(out, start=not opened, delta=piece):
                    sink.add(*event)
                opened = True
            completion = await turn_task
            return await self._complete(row, request, out, opened, completion, sink)
        except asyncio.CancelledError:
            if turn_task is not None and row.id in self._storing:
                # Its store began, so its turn ends whoever cancels (a shutdown past the
                # grace): the response ends as its turn did, never failed beside a reply.
                completion = await finish_despite_cancel(turn_task)
                return await finish_despite_cancel(
                    self._complete(row, request, out, opened, completion, sink)
                )
            if turn_task is not None:
                turn_task.cancel()
            if self._stopping:
                # Shut down past the grace period: said on the row, never left running.
                await self._finish(
                    row,
                    request,
                    "failed",
                    Output(out.message_id, "".join(pieces), cut=True),
                    "the server shut down before the response finished",
                    [],
                    sink,
                )
            raise
        except TurnError as exc:
            return await self._finish(
                row, request, "failed", Output(out.message_id, "".join(pieces), cut=True),
                exc.message, [], sink,
            )  # fmt: skip
        except Exception:
            logger.exception("response %s failed", row.id)
            return await self._finish(
                row,
                request,
                "failed",
                Output(out.message_id, "".join(pieces), cut=True),
                "internal server error",
                [],
                sink,
            )
        finally:
            lease.cancel()

    async def _complete(
        self,
        row: ResponseRow,
        request: ResponsesRequest,
        out: Output,
        opened: bool,
        completion: dict[str, Any],
        sink: EventSink,
    ) -> dict[str, Any]:
        text = completion_text(completion)
        # A model cut short (its token limit, a content filter) ends ``incomplete``.
        reason = INCOMPLETE_REASONS.get(finish_reason_of(completion))
        calls = function_call_items(calls_of(completion))
        # A response that only calls the client's tools has no message item.
        message = bool(text or opened or not calls)
        out = Output(
            out.message_id,
            text,
            done=message,
            usage=completion.get("usage"),
            cut=reason is not None,
        )
        closing = output_events(out, start=not opened, delta=None if opened else text)
        if not message:
            closing = []
        closing += function_call_events(calls, 1 if message else 0)
        status = "completed" if reason is None else "incomplete"
        return await self._finish(row, request, status, out, None, closing, sink, reason, calls)

    async def _enter_store(self, row: ResponseRow) -> bool:
        """The turn's reply is ready: take the row to its storing owner, so that a cancel
        can no longer move it; False when a cancel (or a takeover) moved it first."""
        # Before the write: the sweep and the lease keeper must not stop the run meanwhile.
        self._finishing.add(row.id)
        entered = await self._write(
            self.store.transition,
            row.id,
            expect=("in_progress",),
            owner=self.owner,
            change=Change(
                "in_progress",
                row.body,
                storing_owner(self.owner),
                time.time() + self.lease_seconds,
            ),
            poke=False,
        )
        if entered:
            self._storing.add(row.id)
        else:
            self._finishing.discard(row.id)
        return entered

    async def _finish(
        self,
        row: ResponseRow,
        request: ResponsesRequest,
        status: str,
        out: Output,
        error: str | None,
        closing: list[tuple[str, dict[str, Any]]],
        sink: EventSink,
        incomplete: str | None = None,
        calls: list[JSONObject] | None = None,
    ) -> dict[str, Any]:
        """Store the response's end (its run is finishing: a row moved under it meanwhile
        does not stop it); ``calls``: the client tool calls it stopped for."""
        self._finishing.add(row.id)
        try:
            now = time.time()
            body = body_of(
                row.id,
                request,
                status=status,
                created_at=row.created_at,
                output=out if out.text or out.done else None,
                error=error,
                completed_at=now,
                incomplete=incomplete,
            )
            if calls:
                body["output"] = [*body["output"], *calls]  # type: ignore[misc]
            events = [*closing, terminal_event(body)]
            # Every event before the terminal ones is stored (or sent) first; a background
            # response's terminal events are stored with its terminal status, in one commit.
            await sink.settle()
            if not row.background:
                for event in events:
                    sink.add(*event)
            if not request.store:
                # Kept nothing once answered (``store: false``).
                await self._db(self.store.delete, row.id)
                return body
            stored = await self._write(
                self.store.transition,
                row.id,
                expect=("in_progress",),
                owner=storing_owner(self.owner) if row.id in self._storing else self.owner,
                change=Change(status, dumps(body), completed_at=now, notified=self._quiet(row)),
                events=[(t, dumps(d)) for t, d in events] if row.background else None,
                poke=row.background,
            )
            if stored:
                if not self._quiet(row):
                    await self._told(row.id, events[-1][0])
                return body
            # Cancelled, deleted or taken over meanwhile: what the store says stands.
            current = await self._db(self.store.get, row.id)
            return json.loads(current.body) if current is not None else body
        finally:
            self._finishing.discard(row.id)

    # ----------------------------------------------------------------- the worker

    async def _work(self) -> None:
        interval = max(0.05, min(self.lease_seconds / 3, 5.0))
        while True:
            # At most a few sweeps a second however many pokes arrive (every write of any
            # server sharing the store pokes); a new queued row is claimed by its own server
            # at once, without waiting for a sweep.
            await asyncio.sleep(_SWEEP_GAP_SECONDS)
            # At once on start: what a dead predecessor left is ended (or run) right away.
            self._wake.clear()
            try:
                await self._sweep()
            except Exception:
                logger.exception("the responses sweep failed (tried again shortly)")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), interval)

    async def _sweep(self) -> None:
        now = time.time()
        active = await self._db(self.store.active, _SWEEP_BATCH)
        await self._stop_lost_runs({row.id for row in active if row.owner == self.owner})
        for row in active:
            if row.id in self._running:
                continue
            if row.status == "queued":
                if not (self._stopping or self._paused) and self._has_room():
                    await self._claim(row)
            elif row.lease_until < now or (row.owner != self.owner and self._owner_dead(row.owner)):
                # A live runner renews its lease (this server's own, between the insert
                # and the start of its run, holds the lease the insert gave it).
                await self._end_abandoned(row)
        if now - self._last_hook_check >= _HOOK_CHECK_EVERY_SECONDS:
            self._last_hook_check = now
            for row in await self._db(self.store.unnotified, _SWEEP_BATCH):
                if (row.completed_at or 0) < now - _HOOK_RETRY_AFTER_SECONDS:
                    # The row's own status: a cancelled one has no terminal stream event
                    # (its stream just ends), yet its hook says response.cancelled.
                    await self._told(row.id, f"response.{row.status}")

    # ----------------------------------------------------------------- cancel, delete

    async def cancel(self, response_id: str) -> ResponseRow | None:
        """Cancel a background response (idempotent): the row first, then its run stops.
        A response whose reply is being stored is not cancelled: the answer is the row as
        it ends (``completed``: already completed)."""
        while True:
            row = await self._db(self.store.get, response_id)
            if row is None or row.status in TERMINAL:
                return row
            if is_storing(row.owner):
                return await self._ended(response_id)
            now = time.time()
            body = await self._cancelled_body(row, now)
            moved = await self._write(
                self.store.transition,
                row.id,
                expect=(row.status,),
                owner=row.owner,
                change=Change(
                    "cancelled", dumps(body), completed_at=now, notified=self._quiet(row)
                ),
                # The owner read above: a run that entered its store since then wins.
                check_owner=True,
            )
            if moved:
                task = self._running.get(response_id)
                if task is not None:
                    task.cancel()
                await self._settle_cancelled(row, body, now)
                if not self._quiet(row):
                    await self._told(response_id, "response.cancelled")
                if runtime_is_open():  # else nothing was dispatched through this process
                    await self._db(get_runtime().cancel_started_by, response_id, by=BY_RESPONSE)
                return await self._db(self.store.get, response_id)

    async def _settle_cancelled(self, row: ResponseRow, body: dict[str, Any], now: float) -> None:
        """A delta its runner stored between the cancel's read and its move is in the
        stream: the cancelled object says it too (no event is stored after the move)."""
        settled = await self._cancelled_body(row, now)
        if settled != body:
            await self._write(
                self.store.transition,
                row.id,
                expect=("cancelled",),
                owner=None,
                change=Change(
                    "cancelled", dumps(settled), completed_at=now, notified=self._quiet(row)
                ),
                check_owner=False,
            )

    async def _cancelled_body(self, row: ResponseRow, now: float) -> dict[str, Any]:
        """The Response of ``row`` cancelled now: with what it streamed so far (its stored
        events), the message ``incomplete``."""
        stored = await self._db(self.store.events_after, row.id, -1, 100_000)
        out = partial_output((event.type, json.loads(event.data)) for event in stored)
        return body_of(
            row.id,
            ResponsesRequest.from_json(row.request),
            status="cancelled",
            created_at=row.created_at,
            output=out,
            completed_at=now,
        )

    async def _ended(self, response_id: str) -> ResponseRow | None:
        """The row once it is terminal (its store's end pokes), or as it stands after a
        lease: a runner that died mid-store has its row ended by a sweep, not here."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.lease_seconds
        while True:
            tick = self._tick
            row = await self._db(self.store.get, response_id)
            if row is None or row.status in TERMINAL or loop.time() >= deadline:
                return row
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(tick.wait(), self.poll_seconds)

    async def delete(self, response_id: str) -> bool:
        """Remove a stored response and its events; a running one is cancelled first."""
        row = await self._db(self.store.get, response_id)
        if row is None:
            return False
        if row.status not in TERMINAL:
            await self.cancel(response_id)
        return await self._write(self.store.delete, response_id)

    # ----------------------------------------------------------------- streams

    def follow(
        self, response_id: str, after: int, *, keepalive_seconds: float = 15.0
    ) -> AsyncIterator[ResponseEvent | None]:
        """The stored events after ``after``, then the live ones (``response_events.follow``)."""
        return follow(
            self.store,
            lambda: self._tick,
            response_id,
            after,
            poll_seconds=self.poll_seconds,
            keepalive_seconds=keepalive_seconds,
        )
