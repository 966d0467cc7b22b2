"""The web UI's delivery target: completions of web UI work become wake-up turns.

The gateway runner offers this ``ClaimingTarget`` every completion that names
``origin_ui_session_id`` without claiming it first. ``offer`` formats the self-contained
wake-up text and runs ``api.background_process.handle_completion`` off the event loop: it
routes, checks busy BEFORE claiming (a busy session parks the wake-up in
``DEFERRED_PROCESS_WAKEUPS`` with its ledger row still pending), claims, starts the turn and
settles the claim by the answer; offers for one session go one at a time, each until its
claim was settled. ``fire_deferred(session_id)`` is awaited when a session
becomes free (its turn ended; an approval is decided inside a turn, so after it): the parked
wake-ups are offered again at once, no polling. A restart loses only the in-memory parking;
the ledger's restore re-offers the pending rows. Ledger rows that change are announced as
``delivery`` events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from api import background_process as bp
from api import config as cfg
from api import deliveries
from api.event_log import EventLog
from api.views import session_source
from api.web_turns import WebTurns
from gateway.config import Platform
from gateway.wake import format_wake_text

__all__ = ["WebUIDeliveryTarget"]

logger = logging.getLogger(__name__)

_SETTLE_WAIT_SECONDS = 40.0  # start_session_turn answers within 30 s


class WebUIDeliveryTarget:
    """Registered by the composition root for ``Platform.WEBUI``."""

    def __init__(self, turns: WebTurns, log: EventLog, *, process_registry: Any) -> None:
        self.turns = turns
        self.log = log
        self.process_registry = process_registry
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session_locks: dict[str, asyncio.Lock] = {}
        self._settled: dict[str, asyncio.Event] = {}

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.turns.on_free = self.fire_deferred
        bp.add_settle_listener(self._on_settled)

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
        # One offer per session at a time, until its wake-up turn was accepted or refused:
        # a sibling completion then finds the session busy and waits without a claim,
        # instead of claiming, being refused and backing off.
        lock = self._session_locks.setdefault(session_id or "", asyncio.Lock())
        async with lock:
            settled = asyncio.Event()
            self._settled[delivery_id] = settled
            try:
                outcome = await asyncio.to_thread(
                    bp.handle_completion, evt, text, process_registry=self.process_registry
                )
                if outcome == "started":
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(settled.wait(), _SETTLE_WAIT_SECONDS)
            finally:
                self._settled.pop(delivery_id, None)
        if outcome == "deferred" and session_id and not self.turns.is_busy(session_id):
            # The session became free between the busy check and the parking.
            await self.fire_deferred(session_id)
        await self.announce_delivery(delivery_id)
        return outcome

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
        with cfg.MAPS_LOCK:
            cfg.PROCESS_SESSION_INDEX[delivery_id] = origin
        return origin

    async def fire_deferred(self, session_id: str) -> None:
        with cfg.MAPS_LOCK:
            parked = cfg.DEFERRED_PROCESS_WAKEUPS.pop(session_id, {})
        for evt in parked.values():
            await self.offer(evt)

    async def announce_delivery(self, delivery_id: str) -> None:
        if not delivery_id:
            return
        try:
            view = await asyncio.to_thread(deliveries.get, delivery_id)
        except Exception:
            return  # not a ledger row (or no ledger): nothing to show
        await self.log.append("delivery", {"delivery": view})

    def _on_settled(self, delivery_id: str) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return

        def schedule() -> None:
            settled = self._settled.get(delivery_id)
            if settled is not None:
                settled.set()
            loop.create_task(self.announce_delivery(delivery_id))

        loop.call_soon_threadsafe(schedule)
