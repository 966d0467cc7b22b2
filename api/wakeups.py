"""The web UI's delivery target: completions of web UI work become wake-up turns.

The gateway runner offers this ``ClaimingTarget`` every completion that names
``origin_ui_session_id`` without claiming it first. ``offer`` runs on the event loop, where
the web UI's turns live, and calls them directly: it formats the self-contained wake-up
text, routes (``api.background_process.route_session``), checks busy BEFORE claiming (a busy
session parks the wake-up in ``DEFERRED_PROCESS_WAKEUPS`` with its ledger row still
pending), claims, starts the turn (``WebTurns.astart``) and settles the claim by the typed
answer: acknowledged once the accepted turn is stored (a server that dies mid-turn leaves
the row pending), released otherwise (refunded when ``TurnRefused.refund`` says the refusal
was transient), dropped when the session is gone. Offers for one session go one at a time.
The only waits off the loop are the store's: the claim and its settlement are ledger writes
awaited on the writer, and a session's record is read in a thread.

``fire_deferred(session_id)`` is awaited when a session becomes free (its turn ended; an
approval is decided inside a turn, so after it), on whichever server the turn ran: the
turn's ``turn.end`` event in the shared log tells every server, and each offers what it
parked at once, no polling. A restart loses only the in-memory parking; the ledger's restore
re-offers the pending rows. Ledger rows that change are announced as ``delivery`` events.

The seed-pinned thread path (``api.background_process.handle_completion`` and
``api.routes.start_session_turn``) follows the same rules for callers outside the web UI.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import tools.async_delegation as ad
from api import background_process as bp
from api import config as cfg
from api import deliveries
from api.event_log import EventLog, LoggedEvent
from api.turn_answers import TurnAccepted, TurnRefused
from api.views import session_source
from api.web_turns import WAKEUP_SOURCE, WebTurns
from delivery import traces
from gateway.config import Platform
from gateway.tasks import finish_or_cancel
from gateway.wake import format_wake_text

__all__ = ["WebUIDeliveryTarget"]

logger = logging.getLogger(__name__)


class WebUIDeliveryTarget:
    """Registered by the composition root for ``Platform.WEBUI``."""

    def __init__(self, turns: WebTurns, log: EventLog, *, process_registry: Any) -> None:
        self.turns = turns
        self.log = log
        self.process_registry = process_registry
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session_locks: dict[str, asyncio.Lock] = {}
        self._settling: set[asyncio.Task[None]] = set()

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
        task = asyncio.create_task(self.fire_deferred(session_id))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    def stop(self) -> None:
        bp.remove_settle_listener(self._on_settled)
        self.turns.on_free = None
        self._loop = None

    async def offer(self, evt: dict[str, Any]) -> str:
        try:
            text = format_wake_text(evt)
        except Exception:
            logger.exception("cannot format a wake-up for %r", evt.get("delegation_id"))
            return "ignored"
        delivery_id = bp.work_id(evt)
        session_id = bp.route_session(evt) or await self._index_origin(evt, delivery_id)
        if session_id is None:
            return "foreign"
        # One offer per session at a time, until its wake-up turn was accepted or refused:
        # a sibling completion then finds the session busy and waits without a claim,
        # instead of claiming, being refused and backing off.
        async with self._session_locks.setdefault(session_id, asyncio.Lock()):
            outcome = await self._wake(session_id, evt, text, delivery_id)
        if outcome == "deferred" and not await self.turns.ais_busy(session_id):
            # The session became free between the busy check and the parking.
            await self.fire_deferred(session_id)
        await self.announce_delivery(delivery_id)
        return outcome

    async def _wake(self, session_id: str, evt: dict[str, Any], text: str, delivery_id: str) -> str:
        if await self.turns.ais_busy(session_id):
            bp.defer(session_id, evt)  # no claim taken, so no attempt spent
            return "deferred"
        try:
            claim = await ad.aclaim_event_delivery(evt, bp.CONSUMER)
        except Exception:
            logger.exception("could not claim %s", delivery_id)
            return "held"
        if claim is None:
            return "held"  # another consumer holds it, or it is settled
        try:
            answer = await self.turns.astart(session_id, text, WAKEUP_SOURCE)
        except Exception:
            logger.exception("wake-up turn for %s raised", delivery_id)
            answer = TurnRefused(500, "the wake-up turn raised")
        if isinstance(answer, TurnAccepted):
            cfg.remember(delivery_id, time.time())
            # Settled once the turn is stored, not when it starts: a server that dies during
            # the wake-up turn leaves the row pending, and its re-offer runs the turn (keyed by
            # the delivery id) once. The session's lock is not held meanwhile: a sibling finds
            # the session busy and waits without a claim.
            task = asyncio.create_task(self._settle_when_stored(evt, claim, answer, delivery_id))
            self._settling.add(task)
            task.add_done_callback(self._settling.discard)
            return "started"
        try:
            logger.info("wake-up %s refused (%s: %s)", delivery_id, answer.status, answer.error)
            if answer.status == 404:
                # The session is gone for good (deleted): nothing will ever take this
                # wake-up, so it is dropped at once, with the reason, instead of spending the
                # attempt budget over minutes. Its result stays queryable in the ledger.
                await asyncio.to_thread(
                    ad.drop_event_delivery, evt, claim, f"session {session_id} was deleted"
                )
                return "dropped"
            if answer.busy:
                bp.defer(session_id, evt)
            await ad.arelease_event_delivery(evt, claim, retryable=answer.refund)
        except Exception:
            # The claim lapses by itself and the row is offered again: nothing is lost.
            logger.exception("could not settle the claim on %s", delivery_id)
        return "refused"

    async def _settle_when_stored(
        self, evt: dict[str, Any], claim: str, answer: TurnAccepted, delivery_id: str
    ) -> None:
        stored = True if answer.stored is None else await answer.stored
        try:
            if stored:
                if not await ad.acomplete_event_delivery(evt, claim):
                    logger.warning("wake-up %s ran but its claim had lapsed", delivery_id)
            else:
                # The turn failed before storing anything (the model failed: the session's
                # wake-ups pause until the user is back). The attempt was not the delivery's
                # fault: it is refunded, and the row is offered again.
                logger.info("wake-up turn %s stored nothing; offered again later", delivery_id)
                await ad.arelease_event_delivery(evt, claim, retryable=True)
        except Exception:
            # The claim lapses by itself and the row is offered again: nothing is lost.
            logger.exception("could not settle the claim on %s", delivery_id)
        await self.announce_delivery(delivery_id)

    async def settle(self, grace_seconds: float) -> None:
        """Let the wake-ups whose turns are ending settle their claims (at shutdown, after
        the turns drained); what is still open then lapses and is offered again."""
        await finish_or_cancel(self._settling, grace_seconds)

    async def _index_origin(self, evt: dict[str, Any], delivery_id: str) -> str | None:
        """Work that names its web UI session only as ``origin_session_id`` (older turns):
        indexed in ``PROCESS_SESSION_INDEX`` when that session is a web UI one."""
        origin = evt.get("origin_session_id")
        if not isinstance(origin, str) or not origin or not delivery_id:
            return None
        try:
            record = await asyncio.to_thread(self.turns.store.get_session, origin)
        except Exception:
            return None
        if record is None or session_source(record) != Platform.WEBUI.value:
            return None
        cfg.index_session(delivery_id, origin)
        return origin

    async def fire_deferred(self, session_id: str) -> None:
        with cfg.MAPS_LOCK:
            parked = cfg.DEFERRED_PROCESS_WAKEUPS.pop(session_id, {})
        for evt in parked.values():
            # Offered here, not by the runner: its own delivery span.
            with traces.delivery_span(evt):
                traces.note_outcome(await self.offer(evt))

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
