"""The turn service: one conversational turn on a stored session, whatever surface asked.

A surface (the API server now, the web UI next) parses its request into a ``TurnRequest``
and gets back either a ``ReplayedTurn`` (the stored answer to a repeated idempotency key)
or a ``StartedTurn`` (a task that runs the agent, plus a queue of content deltas when it
streams). The service owns what every surface needs the same way:

* beginning the turn: the stored transcript, and the delivery rows background work left
  since the last turn, taken exactly once (two racing turns never both fold a row);
* the model context: the request's system prompt, the transcript (earlier deliveries in
  their place), the new deliveries as one ``[reveille:delivery]`` system message, the new
  user message;
* running the agent, with a ``ToolContext`` that routes background work back here;
* storing the turn (``gateway.turns.recording``): the user message, the reply and the
  idempotency record in one commit, ordered against a cancel by the turn's ``TurnFence``
  (``StartedTurn.cancel``): a cancel before the store began leaves nothing stored, one
  after it loses (``gateway.turns.fence``);
* the idempotency protocol: claim, replay a finished answer, wait (then conflict) while the
  first attempt runs, forget the claim when the turn fails, take over a dead owner's claim;
* the cap on turns running at once (``max_concurrent_runs``; a caller with a pool of its
  own, background responses, sets ``own_slot`` and takes none of it);
* approvals (``hold_sessions``: the API server, Telegram): the session's lease while one
  is pending, and with ``park_on_approval`` an early answer (see ``gateway.turns.gate``);
* client tools (``client_tool_timeout`` set: the API server): a turn that calls one is
  parked in its transcript and resumed with the client's results
  (``gateway.turns.client_calls``).

A session that does not exist yet is written by the commit that stores its first turn, so
a new conversation costs one read before the model runs and one durable write after (a
streamed turn writes it before the stream opens: its client hears of the session at
once). If the agent starts background work first, ``ToolContext.prepare_background`` writes the
session before the work starts: a result never arrives for a session its deliverer does
not know. Refusals are ``TurnError`` with a ``kind``; the surface maps kinds to its status
codes. Nothing here knows HTTP.

The vocabulary between a surface and this service (``TurnRequest``, ``StartedTurn``,
``TurnError`` ...) is ``gateway.turns.requests``, re-exported here.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Coroutine, Mapping, Sequence
from dataclasses import replace
from typing import Any

from agent.messages import ChatMessage
from agent.providers.base import DeltaCallback, ProviderError
from agent.tools import ConfirmCallback, ToolContext, ToolProgress, UnitConfirmCallback
from delivery import traces
from delivery.session_backend import ApprovalRecord
from gateway.config import Platform
from gateway.session import SessionStore, chat_session_key
from gateway.tasks import finish_or_cancel
from gateway.turns.client_calls import (
    ParkedCalls,
    PendingResult,
    answers_timeout,
    check_request,
    find_parked,
    park_metadata,
    resume_tail,
    time_out,
    timeout_prefix,
    without_park,
)
from gateway.turns.compacting import BegunTurn, TurnCompaction
from gateway.turns.compaction import Compactor, seen_delivery_ids
from gateway.turns.conversation import (
    bound_context,
    build_context,
    delivery_context_text,
    derive_session_id,
    message_text,
    pick_session,
    well_formed_result,
    with_images,
)
from gateway.turns.fence import TurnFence, TurnTask, finish_despite_cancel
from gateway.turns.first_turns import FirstTurns
from gateway.turns.gate import Parking, TurnGate, busy_reason
from gateway.turns.hold import TurnHold
from gateway.turns.idempotency import IdempotencyClaims, KeyReused, StillRunning
from gateway.turns.recording import TurnRecorder
from gateway.turns.requests import (
    Conversation,
    ReplayedTurn,
    ResponseRenderer,
    StartedTurn,
    TurnError,
    TurnRequest,
    TurnRunner,
    agent_turn_runner,
    request_fingerprint,
)

__all__ = [
    "ReplayedTurn",
    "StartedTurn",
    "TurnError",
    "TurnRequest",
    "TurnRunner",
    "TurnService",
    "agent_turn_runner",
    "build_context",
    "delivery_context_text",
    "derive_session_id",
    "message_text",
]

logger = logging.getLogger(__name__)


class TurnService:
    """Begins, runs and stores turns on a ``SessionStore`` (see the module docstring)."""

    def __init__(
        self,
        store: SessionStore,
        turn_runner: TurnRunner,
        *,
        render: ResponseRenderer,
        platform: Platform = Platform.API_SERVER,
        max_concurrent_runs: int = 10,
        idempotency_wait_seconds: float = 300.0,
        session_key_of: Callable[[str], str] | None = None,
        confirm_for: Callable[..., ConfirmCallback] | None = None,
        confirm_unit_for: Callable[..., UnitConfirmCallback] | None = None,
        context_chars: int = 400_000,
        hold_sessions: bool = False,
        park_on_approval: bool = False,
        compactor: Compactor | None = None,
        client_tool_timeout: float | None = None,
    ) -> None:
        """``confirm_for(session_id)``, when given, is the approval hook of that session's
        tool calls (``ToolContext.confirm``). Turns of ``Platform.WEBUI`` mark the
        background work they start with their session (``origin_ui_session_id``).
        ``hold_sessions`` makes the service hold the session's lease itself (see the
        module docstring; ``confirm_for`` is then called with ``on_asked=``, as
        ``gateway.approvals.Approvals.confirm_for`` takes it); ``on_approval`` (set by the
        surface) is told of each approval asked. ``confirm_unit_for(session_id, on_asked=)``
        is what the background work its turns start asks (``ToolContext.confirm_unit``):
        approvals that hold no session."""
        if max_concurrent_runs < 1:
            raise ValueError("max_concurrent_runs must be at least 1")
        self.store = store
        self.max_concurrent_runs = max_concurrent_runs
        self._run_agent = turn_runner
        self._render = render
        self._platform = platform
        # Its name, read by every turn (an enum's ``.value`` is a descriptor call each time).
        self._platform_name: str = platform.value
        self._confirm_for = confirm_for
        self._confirm_unit_for = confirm_unit_for
        self._hold_sessions = hold_sessions
        self._park_on_approval = park_on_approval
        self.on_approval: Callable[[ApprovalRecord], Awaitable[None]] | None = None
        self.context_chars = context_chars  # what one turn sends the model, at most
        # Summarises older turns when the context nears the model's window (None: never).
        self.compactor = compactor
        self._compaction = TurnCompaction(compactor, turn_runner)
        self._recorder = TurnRecorder(store, platform)
        self._claims = IdempotencyClaims(store, wait_seconds=idempotency_wait_seconds)
        self._active_runs = 0
        # Turns of a caller's own pool (``TurnRequest.own_slot``): counted for the metrics only.
        self.background_runs = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        # Ids whose first turn runs here and is not stored yet (``first_turns``).
        self._first_turns = FirstTurns()
        # A surface whose session ids are not chat ids says how to key its sessions.
        self._session_key_of = session_key_of
        # Client tools: how long a parked turn waits for the client's results (None: the
        # surface takes no client tools); the server's tool names, which client tools avoid.
        self.client_tool_timeout = client_tool_timeout
        self.tool_names: Callable[[], Collection[str]] = tuple

    @property
    def turns_stored(self) -> int:
        """Turns stored (read by the metrics)."""
        return self._recorder.turns_stored

    @property
    def wake_turns(self) -> int:
        """Wake-up turns stored (read by the metrics)."""
        return self._recorder.wake_turns

    @property
    def active_runs(self) -> int:
        return self._active_runs

    def session_key(self, session_id: str) -> str:
        if self._session_key_of is not None:
            return self._session_key_of(session_id)
        # A surface whose chats are its sessions (cached: asked by every turn).
        return chat_session_key(self._platform, session_id)

    # ----------------------------------------------------------------- which session

    async def resolve_conversation(
        self, messages: Sequence[Mapping[str, Any]], *, idempotency_key: str | None = None
    ) -> Conversation:
        """The session a request without a session id continues, or a new one's id (see
        ``gateway.turns.conversation.pick_session``). With an ``idempotency_key`` a repeat of a
        session's last turn is a retry.

        A new id stays reserved for this request until the turn started with it
        (``start`` with ``unwritten``, called next whatever happens) ends.
        """
        home = derive_session_id(messages)
        found = await self.store.asessions_by_prefix(home)
        session_id = pick_session(
            messages, found.transcripts, retry_key=idempotency_key is not None, home=home
        )
        # One read answers both questions, so a new conversation's turn costs one trip to
        # the store's reader, not two.
        live = any(sid == session_id for sid, _ in found.transcripts)
        deleted = session_id == home and found.prefix_deleted
        if live or deleted:
            return Conversation(session_id, unwritten=False)
        session_id = self._first_turns.reserve(session_id, home, idempotency_key)
        return Conversation(session_id, unwritten=True)

    # ----------------------------------------------------------------- starting a turn

    async def start(self, request: TurnRequest) -> StartedTurn | ReplayedTurn:
        """Replay a finished answer, or begin the turn and start it running."""
        try:
            started = await self._start(request)
        except BaseException:
            self._end_first_turn(request)
            raise
        if not isinstance(started, StartedTurn):
            self._end_first_turn(request)
        # A started turn releases it when it ends (``_turn_ended``).
        return started

    def _end_first_turn(self, request: TurnRequest) -> None:
        """Release the reservation ``resolve_conversation`` made for this request."""
        if request.unwritten:
            self._first_turns.release(request.session_id)

    async def _start(self, request: TurnRequest) -> StartedTurn | ReplayedTurn:
        owner: str | None = None
        key = request.idempotency_key
        if key is not None:
            # The claim carries the request's fingerprint, so that the same key sent with
            # another request is told apart while the first one still runs.
            owner = self._claims.owner_for(request_fingerprint(request))
            try:
                replay = await self._claims.claim(key, owner, request.session_id)
            except KeyReused:
                raise TurnError(
                    "key_reused",
                    "this idempotency key was already used with a different request; use a new key",
                ) from None
            except StillRunning:
                raise TurnError(
                    "in_progress", "a request with this idempotency key is still running"
                ) from None
            if replay is not None:
                return ReplayedTurn(replay)
        if not request.own_slot and self._active_runs >= self.max_concurrent_runs:
            await self._claims.forget(key, owner)
            raise TurnError(
                "too_many_turns",
                f"too many turns running (max_concurrent_runs = {self.max_concurrent_runs}); "
                "retry shortly",
            )
        # Counted here, released by the turn itself: a client that goes away does not free
        # a slot while its turn still runs.
        self._take_slot(request)
        fence = TurnFence(request.before_store)
        deltas: asyncio.Queue[str | ToolProgress | None] | None = (
            asyncio.Queue() if request.stream else None
        )
        hold = TurnHold(self.store, request.session_id) if self._hold_sessions else None
        parking = (
            Parking(asyncio.get_running_loop().create_future()) if self._park_on_approval else None
        )
        try:
            if hold is not None and (why := await busy_reason(self.store, request, hold)):
                raise TurnError("session_busy", why)
            parked: ParkedCalls | None = None
            if request.tool_outputs is not None or self._may_be_parked(request):
                parked = await self._parked(request)
            # else: no park to look for and no results to check: nothing to refuse.
            begun = await self._begin(request)
            if request.stream:
                # A stream answers before the turn is stored, and its client may continue
                # the session at once: write it first.
                await self._session_writer(request.session_id, begun)()
            # A ``TurnTask``: its store runs in it, whatever cancels it (``finish_despite_cancel``),
            # without a second task.
            task: TurnTask[dict[str, Any]] = TurnTask(
                traces.turn_work(
                    self._run(request, begun, owner, deltas, fence, hold, parking, parked),
                    session_id=request.session_id,
                    platform=self._platform_name,
                    wakeup=request.wakeup,
                    parent=request.traceparent,
                ),
                loop=asyncio.get_running_loop(),
            )
        except BaseException:
            self._free_slot(request)
            await self._claims.forget(key, owner)
            if hold is not None:
                await hold.release()
            raise
        self._tasks.add(task)

        def never_ran() -> None:
            # What ``_run``'s ``finally`` and its failure path release, for a turn cancelled
            # before it began (a Stop in the loop iteration that started it).
            self._free_slot(request)
            if deltas is not None:
                deltas.put_nowait(None)
            self._spawn(self._release_unrun(key, owner, hold))

        # One callback for everything the turn's end settles (each is a loop step of its
        # own), the wake-up of the caller waiting for the answer included.
        task.add_done_callback(functools.partial(self._turn_ended, request, fence, never_ran))
        task.resolves_waiter = True
        fence.bind(task)
        return StartedTurn(task, deltas, parking.future if parking is not None else None, fence)

    def _turn_ended(
        self,
        request: TurnRequest,
        fence: TurnFence,
        never_ran: Callable[[], None],
        task: TurnTask[Any],
    ) -> None:
        self._tasks.discard(task)
        if not fence.began:
            never_ran()
        # The caller may be gone by the time the turn fails; the error is logged, not lost.
        if not task.cancelled():
            exc = task.exception()  # marks it retrieved
            if exc is not None and not isinstance(exc, TurnError):
                logger.debug("turn task failed: %r", exc)
        self._end_first_turn(request)
        # Last: the caller wakes to a turn whose end is settled.
        task.resolve_waiter()

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` beside the turns: a drain waits for it as for them."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _release_unrun(
        self, key: str | None, owner: str | None, hold: TurnHold | None
    ) -> None:
        await self._claims.forget(key, owner)
        if hold is not None:
            await hold.release()

    def _may_be_parked(self, request: TurnRequest) -> bool:
        """Whether the session may hold a park: client tools are on, and it was written."""
        return self.client_tool_timeout is not None and not request.unwritten

    async def _parked(self, request: TurnRequest) -> ParkedCalls | None:
        """The park a resuming request continues; refuses what does not fit the session's
        park (a new message while calls are pending, results nobody waits for); finishes a
        park past its deadline."""
        parked: ParkedCalls | None = None
        if self._may_be_parked(request):
            parked = await find_parked(self.store, request.session_id)
            # The sweep's resume (each call answered with the timeout's error) goes on.
            if (
                parked is not None
                and parked.expired()
                and not answers_timeout(parked, request.tool_outputs)
            ):
                await time_out(self.store, request.session_id, parked)
                check_request(None, request.tool_outputs, wakeup=request.wakeup)
                return replace(parked, timed_out=True)
        check_request(parked, request.tool_outputs, wakeup=request.wakeup)
        return parked

    def _take_slot(self, request: TurnRequest) -> None:
        if request.own_slot:
            self.background_runs += 1
        else:
            self._active_runs += 1

    def _free_slot(self, request: TurnRequest) -> None:
        if request.own_slot:
            self.background_runs -= 1
        else:
            self._active_runs -= 1

    async def drain(self, grace_seconds: float) -> None:
        """Let running turns finish and store their results; cancel what outlasts the grace."""
        await finish_or_cancel(self._tasks, grace_seconds)

    async def _begin(self, request: TurnRequest) -> BegunTurn:
        session_id = request.session_id
        if request.unwritten and request.create is not None:
            return BegunTurn([], [], request.create, exclusive=True)
        turn = await self.store.abegin_turn(session_id)
        if turn.state == "live":
            return BegunTurn(
                [m.as_dict() for m in turn.history], [m.as_dict() for m in turn.taken], None
            )
        if request.create is None:
            raise TurnError("session_not_found", f"session {session_id!r} does not exist")
        if turn.state == "deleted":
            # A conversation that comes back after its session was deleted starts it afresh,
            # explicitly, before the turn runs (its late results must not be adopted).
            turn = await self.store.abegin_turn(session_id, create_with=request.create)
            return BegunTurn(
                [m.as_dict() for m in turn.history], [m.as_dict() for m in turn.taken], None
            )
        return BegunTurn([], [], request.create)

    # ----------------------------------------------------------------- running it

    async def _run(
        self,
        request: TurnRequest,
        begun: BegunTurn,
        owner: str | None,
        deltas: asyncio.Queue[str | ToolProgress | None] | None,
        fence: TurnFence,
        hold: TurnHold | None = None,
        parking: Parking | None = None,
        parked: ParkedCalls | None = None,
    ) -> dict[str, Any]:
        fence.began = True
        session_id, key = request.session_id, request.idempotency_key
        started = time.monotonic()
        gate: TurnGate | None = None
        try:
            # A resumed Responses turn may send no message at all, only the client's results.
            # (A loop, not a generator: every turn asks.)
            user_message: Mapping[str, Any] = {}
            for message in reversed(request.messages):
                if message["role"] == "user":
                    user_message = message
                    break
            # Resuming a parked turn: the stored exchange and the client's results take the
            # new message's place (its row, the park, is not history again). A park this
            # request timed out: its exchange with an error result per call comes first.
            resumed = parked if parked is not None and not parked.timed_out else None
            tail = resume_tail(resumed, request.tool_outputs or ()) if resumed else None

            def unbounded(history: list[dict[str, Any]]) -> list[ChatMessage]:
                rows = without_park(history, parked) if parked is not None else history
                built = build_context(
                    rows,
                    begun.taken,
                    request.messages,
                    user_message,
                    wakeup=request.wakeup,
                    tail=tail,
                )
                if parked is not None and parked.timed_out:
                    built[-1:-1] = timeout_prefix(parked)
                return built

            def bounded(built: list[ChatMessage]) -> list[ChatMessage]:
                if tail:
                    # The exchange stays whole (a tool result needs its call): the bound
                    # shortens what comes before it.
                    cut = len(built) - len(tail)
                    room = self.context_chars - sum(len(str(m.get("content") or "")) for m in tail)
                    return [*bound_context(built[:cut], max(room, 1000)), *built[cut:]]
                return with_images(bound_context(built, self.context_chars), user_message)

            def context_of(history: list[dict[str, Any]]) -> list[ChatMessage]:
                return bounded(unbounded(history))

            # Judged on the whole history: the character bound would otherwise hide how
            # long it grew, and a large window would never be reached (older turns dropped
            # by the bound instead of summarised).
            built = unbounded(begun.history)
            if self._compaction.due(begun, built):
                built = unbounded(await self._compaction.compact(request, begun, hold, force=False))
            context = bounded(built)
            if hold is not None and self._confirm_for is not None:
                gate = self._gate(request, begun, user_message, owner, hold, parking, deltas)
            ctx = ToolContext(
                session_id=session_id,
                session_key=self.session_key(session_id),
                platform=self._platform_name,
                before_background=self._session_writer(session_id, begun),
                origin_ui_session_id=session_id if self._platform is Platform.WEBUI else None,
                confirm=(
                    gate.confirm
                    if gate is not None
                    else (self._confirm_for(session_id) if self._confirm_for else None)
                ),
                confirm_unit=(
                    self._confirm_unit_for(session_id, on_asked=self.on_approval)
                    if self._confirm_unit_for is not None
                    else None
                ),
            )
            on_delta: DeltaCallback | None = None
            if deltas is not None:

                async def on_delta(piece: str) -> None:
                    if parking is not None:
                        if parking.future.done():
                            return  # answered already: the rest goes to the transcript
                        parking.streamed.append(piece)
                    deltas.put_nowait(piece)

                async def on_progress(step: ToolProgress) -> None:
                    deltas.put_nowait(step)

                ctx.on_progress = on_progress

            extra: dict[str, Any] = (
                {"options": request.model_options} if request.model_options else {}
            )
            if request.tool_offer is not None:
                extra["offer"] = request.tool_offer
            reply, context = await self._compaction.run(
                request, begun, hold, context_of, context, ctx, on_delta, extra
            )
            result = well_formed_result(reply)
            park, shown = self._client_calls(request, reply, result, tail)
            response = self._render(shown)
            seen = seen_delivery_ids(begun.history, begun.taken, context)
            if not await fence.enter_store():
                # Cancelled first (a cancel from this loop is already pending on the task).
                raise asyncio.CancelledError
            # From here a cancel loses: the store runs to its end, whoever cancels.
            if parking is not None:
                parking.storing = True
                if parking.future.done() and gate is not None:
                    await finish_despite_cancel(gate.store_answer(str(result.content or "")))
                    fence.stored()
                    self._recorder.turns_stored += 1
                    return parking.future.result()
            await finish_despite_cancel(
                self._recorder.record(
                    request, begun, user_message, result, response, owner, seen, resumed, park
                )
            )
            fence.stored()
            # One line per turn for operators: who and how long, never what was said.
            logger.info(
                "%s turn in %s stored (%.0f ms, %d messages of context)",
                "wake-up" if request.wakeup else self._platform_name,
                session_id,
                (time.monotonic() - started) * 1000,
                len(context),
            )
            return response
        except ProviderError as exc:
            await self._claims.forget(key, owner)
            if gate is not None:
                await gate.store_failure(f"the model provider failed: {exc}")
            raise TurnError("upstream", f"the model provider failed: {exc}") from exc
        except BaseException as exc:
            await self._claims.forget(key, owner)
            if gate is not None:
                await gate.store_failure(repr(exc))
            raise
        finally:
            self._free_slot(request)
            if hold is not None:
                await asyncio.shield(hold.release())
            if deltas is not None and (parking is None or not parking.future.done()):
                deltas.put_nowait(None)

    def _client_calls(
        self, request: TurnRequest, reply: Any, result: Any, tail: list[ChatMessage] | None
    ) -> tuple[dict[str, Any] | None, Any]:
        """The display metadata that parks the turn and what the surface renders. With
        pending client tool calls the turn parks (client tools on) and shows them in the
        client's names; most replies have none, and park nothing and show ``result``."""
        pending = getattr(reply, "pending_calls", None)
        if not pending:
            return None, result
        park = None
        if self.client_tool_timeout is not None:
            steps = [*(tail or []), *getattr(reply, "new_messages", [])]
            park = park_metadata(pending, steps, self.client_tool_timeout)
        offer = request.tool_offer
        calls = [offer.shown(call) if offer is not None else call for call in pending]
        return park, PendingResult(str(result.content or ""), getattr(result, "usage", None), calls)

    def _gate(
        self,
        request: TurnRequest,
        begun: BegunTurn,
        user_message: Mapping[str, Any],
        owner: str | None,
        hold: TurnHold,
        parking: Parking | None,
        deltas: asyncio.Queue[str | ToolProgress | None] | None,
    ) -> TurnGate:
        async def store_note(note: Any, response: dict[str, Any]) -> None:
            # seen=[]: the model call is not over; its results stay pinned until one is stored.
            await self._recorder.record(request, begun, user_message, note, response, owner, [])
            # Written now: what comes after the decision only continues this session.
            begun.unwritten, begun.exclusive = None, False

        assert self._confirm_for is not None
        return TurnGate(
            store=self.store,
            session_id=request.session_id,
            confirm_for=self._confirm_for,
            hold=hold,
            on_approval=self.on_approval,
            render=self._render,
            parking=parking,
            store_note=store_note,
            deltas=deltas,
        )

    def _session_writer(self, session_id: str, begun: BegunTurn) -> Callable[[], Awaitable[None]]:
        return self._recorder.session_writer(session_id, begun)
