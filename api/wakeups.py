"""The web UI's delivery target: completions of web UI work become wake-up turns.

The gateway runner offers this ``ClaimingTarget`` every completion that names
``origin_ui_session_id`` without claiming it first. ``offer`` runs on the event loop, where
the web UI's turns live, and calls them directly: it routes
(``api.background_process.route_session``) and gathers the completion into its session's
next wake-up (``gateway.coalesce``: what arrives within ``coalesce_seconds``, or while the
session's wake-up is pending or running, is ONE turn listing each result,
``gateway.wake_text.format_wake_batch``). A batch checks busy BEFORE claiming (a busy
session parks its results in ``DEFERRED_PROCESS_WAKEUPS`` with their ledger rows still
pending), then ``gateway.settle`` claims each row, starts one turn (``WebTurns.astart``) and
settles every claim by its typed answer: acknowledged once the accepted turn is stored (a
server that dies mid-turn leaves the rows pending), released otherwise (refunded when
``TurnRefused.refund`` says the refusal was transient), dropped when the session is gone.
Batches of one session go one at a time.
The only waits off the loop are the store's: the claim and its settlement are ledger writes
awaited on the writer, and a session's record is read in a thread.

``fire_deferred(session_id)`` is awaited when a session becomes free (its turn ended; an
approval is decided inside a turn, so after it), on whichever server the turn ran: the
turn's ``turn.end`` event in the shared log tells every server, and each offers what it
parked at once, together as one wake-up, no polling. A restart loses only the in-memory
parking; the ledger's restore re-offers the pending rows. Ledger rows that change are
announced as ``delivery`` events.

The seed-pinned thread path (``api.background_process.handle_completion`` and
``api.routes.start_session_turn``) follows the same rules for callers outside the web UI.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from api import background_process as bp
from api import config as cfg
from api import deliveries
from api.event_log import EventLog, LoggedEvent
from api.turn_answers import TurnAccepted
from api.views import session_source
from api.web_turns import WAKEUP_SOURCE, WebTurns
from delivery import traces
from delivery.events import CompletionEvent, parse_event
from gateway.coalesce import DEFAULT_COALESCE_SECONDS, Coalescer, siblings_running
from gateway.config import Platform
from gateway.settle import Settler, Verdict
from gateway.tasks import finish_or_cancel
from gateway.wake import format_wake_text
from gateway.wake_text import DEFAULT_WAKE_TEXT_BUDGET, format_wake_batch

__all__ = ["WebUIDeliveryTarget"]

logger = logging.getLogger(__name__)

# The settle protocol's outcomes as the web UI names them: an accepted turn settles later.
_OUTCOMES = {
    "held": "held",
    "later": "started",
    "delivered": "started",
    "released": "refused",
    "dropped": "dropped",
}


class WebUIDeliveryTarget:
    """Registered by the composition root for ``Platform.WEBUI``."""

    def __init__(
        self,
        turns: WebTurns,
        log: EventLog,
        *,
        process_registry: Any,
        coalesce_seconds: float = DEFAULT_COALESCE_SECONDS,
        wake_text_budget: int = DEFAULT_WAKE_TEXT_BUDGET,
    ) -> None:
        self.turns = turns
        self.log = log
        self.process_registry = process_registry
        self.wake_text_budget = wake_text_budget
        self._loop: asyncio.AbstractEventLoop | None = None
        self._settling: set[asyncio.Task[None]] = set()
        # Claim each, start one turn, settle all once it is stored (``gateway.settle``).
        self.settler = Settler(bp.CONSUMER, after_late=self._announce)
        # Not yet claimed, so a restart loses nothing: the ledger offers them again.
        self._batches: Coalescer[CompletionEvent, str] = Coalescer(
            self._flush, window=coalesce_seconds, missing="held", siblings=siblings_running
        )

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.turns.on_free = self.fire_deferred
        self.log.watch(self._turn_ended)
        bp.add_settle_listener(self._on_settled)

    def _turn_ended(self, event: LoggedEvent) -> None:
        """A turn ended on any server sharing the log: what this server parked behind it is
        offered now (the turn's own server also calls ``fire_deferred`` directly)."""
        if event.type != "turn.end" or self._loop is None:
            return
        session_id = str(event.data.get("session_id"))
        with cfg.MAPS_LOCK:
            if session_id not in cfg.DEFERRED_PROCESS_WAKEUPS:
                return
        self._track(asyncio.create_task(self.fire_deferred(session_id)))

    def stop(self) -> None:
        bp.remove_settle_listener(self._on_settled)
        self.turns.on_free = None
        self._loop = None

    async def offer(self, event: CompletionEvent, *, window: float | None = None) -> str:
        """Gather a completion into its session's next wake-up (``gateway.coalesce``) and
        return what became of it once that wake-up was started or refused. ``window``
        overrides the coalescing window (0 for wake-ups that already waited)."""
        try:
            format_wake_text(event)  # an event that cannot be shown never reaches a batch
        except Exception:
            logger.exception("cannot format a wake-up for %r", event.key)
            return "ignored"
        session_id = bp.route_session(event.wire) or await self._index_origin(event)
        if session_id is None:
            return "foreign"
        if not event.key:
            # Nothing to dedupe a batch by: woken on its own.
            return (await self._flush(session_id, [event])).get("", "held")
        return await self._batches.add(session_id, event.key, event, window=window)

    async def _flush(self, session_id: str, events: Sequence[CompletionEvent]) -> dict[str, str]:
        """One combined wake-up of ``events``; each one's outcome by its delivery id. Batches
        of one session run one at a time (the coalescer's), until the turn was accepted or
        refused: a result arriving meanwhile finds the session busy and waits without a
        claim, instead of claiming, being refused and backing off."""
        outcomes = await self._wake(session_id, events)
        if "deferred" in outcomes.values() and not await self.turns.ais_busy(session_id):
            # The session became free between the busy check and the parking. Not awaited:
            # the parked results join the coalescer's next batch, which waits for this one.
            self._track(asyncio.create_task(self.fire_deferred(session_id)))
        await self._announce(events)
        return outcomes

    def _track(self, task: asyncio.Task[None]) -> None:
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def _wake(self, session_id: str, events: Sequence[CompletionEvent]) -> dict[str, str]:
        if await self.turns.ais_busy(session_id):
            for event in events:
                bp.defer(session_id, event.wire)  # no claim taken, so no attempt spent
            return {event.key: "deferred" for event in events}

        async def start_turn(claimed: Sequence[CompletionEvent]) -> Verdict:
            ids = ", ".join(event.key for event in claimed)
            text = format_wake_batch(claimed, budget=self.wake_text_budget)
            answer = await self.turns.astart(session_id, text, WAKEUP_SOURCE)
            if isinstance(answer, TurnAccepted):
                now = time.time()
                for event in claimed:
                    cfg.remember(event.key, now)
                # Settled once the turn is stored (``Verdict.later``): a server that dies
                # during the wake-up turn leaves every row pending.
                return Verdict.later(answer.stored)
            logger.info("wake-up %s refused (%s: %s)", ids, answer.status, answer.error)
            if answer.status == 404:
                # The session is gone for good (deleted): nothing will ever take these
                # wake-ups, so they are dropped at once, with the reason, instead of spending
                # the attempt budget over minutes. Their results stay queryable in the ledger.
                return Verdict.dropped(f"session {session_id} was deleted")
            if answer.busy:
                for event in claimed:
                    bp.defer(session_id, event.wire)
            return Verdict.released(retryable=answer.refund)

        results = await self.settler.run(session_id, events, start_turn)
        return {key: _OUTCOMES[settled.outcome] for key, settled in results.items()}

    async def settle(self, grace_seconds: float) -> None:
        """Let the wake-ups whose turns are ending settle their claims (at shutdown, after
        the turns drained); what is still open then lapses and is offered again. Results
        still gathering for a wake-up were never claimed: the ledger offers them again."""
        await self._batches.close(0)
        await asyncio.gather(
            finish_or_cancel(self._settling, grace_seconds), self.settler.drain(grace_seconds)
        )

    async def _index_origin(self, event: CompletionEvent) -> str | None:
        """Work that names its web UI session only as ``origin_session_id`` (older turns):
        indexed in ``PROCESS_SESSION_INDEX`` when that session is a web UI one."""
        origin = event.origin_session_id
        if not origin or not event.key:
            return None
        try:
            record = await asyncio.to_thread(self.turns.store.get_session, origin)
        except Exception:
            return None
        if record is None or session_source(record) != Platform.WEBUI.value:
            return None
        cfg.index_session(event.key, origin)
        return origin

    async def fire_deferred(self, session_id: str) -> None:
        """Offer what waited for the session to be free, together: they already waited, so
        they form the next wake-up at once (no coalescing window), as ONE turn."""
        with cfg.MAPS_LOCK:
            parked = cfg.DEFERRED_PROCESS_WAKEUPS.pop(session_id, {})
        if parked:
            await asyncio.gather(*(self._offer_traced(evt) for evt in parked.values()))

    async def _offer_traced(self, evt: dict[str, Any]) -> None:
        # Offered here, not by the runner: its own delivery span.
        with traces.delivery_span(evt):
            traces.note_outcome(await self.offer(parse_event(evt), window=0))

    async def _announce(self, events: Sequence[CompletionEvent]) -> None:
        for event in events:
            await self.announce_delivery(event.key)

    async def announce_delivery(self, delivery_id: str) -> None:
        if not delivery_id:
            return
        try:
            view = await asyncio.to_thread(deliveries.get, delivery_id)
        except Exception:
            return  # not a ledger row (or no ledger): nothing to show
        await self.log.append("delivery", {"delivery": view})

    def _on_settled(self, delivery_id: str) -> None:
        """A wake-up of the seed-pinned thread path settled its claim: announce the row."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        loop.call_soon_threadsafe(lambda: loop.create_task(self.announce_delivery(delivery_id)))
