"""The gateway runner: the API server, the delivery ledger and the completion watcher.

``GatewayRunner`` is the watcher and router only: the composition root
(``reveille.app.serve``) opens the session store, the ledger runtime, the provider and the
surfaces, registers each surface's delivery target here, and closes them all; this floor
never reads settings. ``start()`` watches ``process_registry.completion_queue``
(event-driven: it awaits the queue, no poll interval) until ``stop()``.

Each completion is routed to the session it came from — its ``origin_session_id``, else its
``parent_session_id``, else the API session its ``session_key`` names; never to a session
that merely exists now — then claimed, handed to the delivery target registered for that
session's platform (``gateway.delivery_targets``: the API server's transcript row or
self-POST wake, a push adapter's ``handle_message``) and acknowledged only after the target
accepted it.

Claiming, delivering and settling follow ``gateway.settle`` (the one protocol every consumer
uses): a refusal releases the claim, with ``retryable=True`` only when it was transient (429
after the retries, 503, the server restarting, no target for the platform in this process); a
session that is gone (``SessionGone``) drops the delivery.

Combined wake-ups: completions of a session whose target is a ``BatchTarget`` (push chat
platforms) are gathered by a ``gateway.coalesce.Coalescer`` for ``coalesce_seconds`` after
the first one, and while that session's wake-up is delivered (a push wake-up's turn runs
inside the delivery): each batch is claimed row by row, delivered as ONE wake-up turn and
every claim settled by that one answer, with the same rule a single one follows (complete
all; release all, retryable when transient; drop all when the session is gone). API-server
sessions fold results as transcript rows and are not batched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from delivery import traces
from delivery.events import DELIVERABLE_TYPES, CompletionEvent, delivery_id, parse_event
from gateway.coalesce import DEFAULT_COALESCE_SECONDS, Coalescer, siblings_running
from gateway.config import Platform
from gateway.delivery_targets import (
    BatchTarget,
    ClaimingTarget,
    DeliveryTarget,
    session_platform,
)
from gateway.outcomes import DeliveryOutcome, OutcomeObserver
from gateway.session import SessionRecord, SessionStore
from gateway.settle import Settled, Settler, Verdict
from gateway.tasks import finish_or_cancel
from gateway.wake import WakeDeliveryError
from tools.completion_queue import CompletionQueue
from tools.process_registry import process_registry

__all__ = ["GatewayRunner", "Surface"]

logger = logging.getLogger(__name__)

_API_SESSION_KEY_PREFIX = "agent:main:api_server:"
# A session created this long after the work was dispatched cannot be the one that
# dispatched it (clock jitter allowance).
_ADOPTION_SLACK_SECONDS = 1.0


def _event_id(evt: Any) -> str | None:
    """The id a completion is logged by; never raises, whatever ``evt`` is."""
    return delivery_id(evt, strict=False)


@dataclass(frozen=True)
class _Offer:
    """A routed completion waiting for its session's combined wake-up."""

    event: CompletionEvent
    session: SessionRecord


_NOT_FLUSHED = Settled("held")  # shut down before its batch ran: nothing was claimed


class Surface(Protocol):
    """Another front end served by this process (the web UI, a push chat platform): built
    before the API server starts (it may add a route to it), started once it listens and
    before undelivered completions are re-offered, stopped before it. Its builder registers
    the delivery target of its platform with the runner."""

    async def start(self) -> None: ...

    async def stop(self, *, grace_seconds: float) -> None: ...


class GatewayRunner:
    """The completion watcher and router of ``reveille serve``.

    It is handed the opened session store (the composition root opens and closes it, the
    ledger runtime and every surface) and the delivery targets of the surfaces
    (``register_target``); ``start`` begins watching the completion queue, ``stop`` ends
    the watch and gives deliveries in flight ``shutdown_grace_seconds`` to settle.
    ``on_outcome`` is told of every handled completion (the metrics hook); it must not block.
    """

    def __init__(
        self,
        store: SessionStore,
        *,
        queue: CompletionQueue | None = None,
        on_outcome: OutcomeObserver | None = None,
        shutdown_grace_seconds: float = 10.0,
        coalesce_seconds: float = DEFAULT_COALESCE_SECONDS,
    ) -> None:
        self.store = store
        self.queue = process_registry.completion_queue if queue is None else queue
        self.targets: dict[Platform, DeliveryTarget] = {}
        self.claiming_targets: dict[Platform, ClaimingTarget] = {}
        self.consumer = f"gateway-runner:{os.getpid()}"
        self._on_outcome = on_outcome
        self._watcher: asyncio.Task[None] | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._grace = shutdown_grace_seconds
        self._grace_ends: float | None = None  # set once a drain began to spend the grace
        self.settler = Settler(self.consumer)
        self._batches: Coalescer[_Offer, Settled] = Coalescer(
            self._flush_batch,
            window=coalesce_seconds,
            missing=_NOT_FLUSHED,
            siblings=siblings_running,
        )

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        if self._watcher is None:
            self._watcher = asyncio.create_task(self._watch(), name="completion-watcher")

    async def settle_queued(self, timeout: float) -> bool:
        """Wait until every completion queued so far has been taken and its delivery
        settled (a drain's last step, before ``stop`` cancels the watch): at most
        ``timeout`` seconds, and never past the grace deliveries get at a stop, which this
        wait spends (``stop`` gives the deliveries still running only what is left of it).
        True when nothing is left; False when time ran out or nothing watches."""
        loop = asyncio.get_running_loop()
        self._grace_ends = loop.time() + self._grace
        deadline = min(loop.time() + max(timeout, 0.0), self._grace_ends)
        while self._watcher is not None and not self._watcher.done():
            if self.queue.empty() and not self._handlers:
                return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            if self._handlers:
                await asyncio.wait(set(self._handlers), timeout=remaining)
            else:
                # Queued but not yet taken: the watcher takes it on its next turn.
                await asyncio.sleep(min(0.01, remaining))
        return False

    async def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None
        if self._handlers:
            # Deliveries in flight get a moment; a cancelled one keeps its ledger row
            # pending (its claim lapses and it is offered again).
            grace = self._grace
            if self._grace_ends is not None:
                grace = max(0.0, self._grace_ends - asyncio.get_running_loop().time())
            await finish_or_cancel(self._handlers, grace)
        await self._batches.close(0)

    # ----------------------------------------------------------------- the watcher

    async def _watch(self) -> None:
        while True:
            try:
                evt = await self.queue.get_async()
            except asyncio.CancelledError:
                raise
            except Exception:
                # Never let the watcher die: the events stay durable in the ledger anyway.
                logger.exception("completion queue failed; retrying")
                await asyncio.sleep(0.5)
                continue
            task = asyncio.create_task(self._handle_safely(evt))
            self._handlers.add(task)
            task.add_done_callback(self._handlers.discard)

    async def _handle_safely(self, evt: Any) -> None:
        try:
            await self.handle_event(evt)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("could not handle completion event %r", _safe_id(evt))

    async def handle_event(self, evt: dict[str, Any]) -> str:
        """Route, claim, deliver and settle one completion; returns what happened (and
        tells ``parts.on_outcome``: the one place delivery metrics hook in)."""
        started = time.monotonic()
        with traces.delivery_span(evt):
            settled, platform = await self._handle_event(evt)
            reported = "retryable" if settled.retryable else settled.outcome
            traces.note_outcome(reported)
        logger.info(
            "delivery %s: %s%s (%.0f ms)",
            _safe_id(evt),
            reported,
            f" via {platform.value}" if platform is not None else "",
            (time.monotonic() - started) * 1000,
        )
        observer = self._on_outcome
        if observer is not None:
            try:
                completed = evt.get("completed_at") if isinstance(evt, dict) else None
                observer(
                    DeliveryOutcome(
                        outcome=reported,
                        platform=platform,
                        claimed=settled.claimed,
                        completed_at=completed if isinstance(completed, int | float) else None,
                        event=evt if isinstance(evt, dict) else {},
                    )
                )
            except Exception:
                logger.exception("the delivery outcome observer failed")
        return settled.outcome

    async def _handle_event(self, evt: dict[str, Any]) -> tuple[Settled, Platform | None]:
        """Route, claim, deliver and settle one completion; returns what happened and the
        platform of the session it went to.

        The wire dict is parsed once, here: routing, the settle protocol
        (``gateway.settle``) and the delivery target all read the typed event.
        """
        if not isinstance(evt, dict):
            logger.error("ignoring a completion that is not a dict: %r", type(evt).__name__)
            return Settled("ignored"), None
        if evt.get("type") not in DELIVERABLE_TYPES:
            return await self._refuse_unknown_type(evt), None
        event = parse_event(evt)  # a mapping always parses (unknown types are generic)
        if event.origin_ui_session_id:
            # The web UI's: ``origin_ui_session_id`` is final, and its consumer claims.
            return await self._offer(Platform.WEBUI, event), Platform.WEBUI
        route, session_id, session = await asyncio.to_thread(self._route, event)
        if route == "session" and session is not None:
            claiming = session_platform(session)
            if claiming in self.claiming_targets:
                return await self._offer(claiming, event), claiming
            if isinstance(self.targets.get(claiming), BatchTarget):
                return await self._coalesce(event, session), claiming
        if route == "foreign":
            logger.debug("completion %s belongs to another surface", event.key)
            return Settled("foreign"), None

        async def deliver(events: Sequence[CompletionEvent]) -> Verdict:
            if route == "gone":
                return Verdict.dropped(f"session {session_id} no longer exists")
            if route == "unknown" or session is None:
                logger.warning(
                    "completion %s has no known origin session; released, not delivered elsewhere",
                    event.key,
                )
                return Verdict.released(retryable=False)
            await self._deliver(events[0], session)
            return Verdict.delivered()

        platform = session_platform(session) if session is not None else None
        results = await self.settler.run(session_id or event.key, [event], deliver)
        return results[event.key], platform

    # ----------------------------------------------------------------- combined wake-ups

    async def _coalesce(self, event: CompletionEvent, session: SessionRecord) -> Settled:
        offer = _Offer(event, session)
        if not event.key:
            # No ledger row to claim or to dedupe by: delivered on its own, as before.
            return (await self._flush_batch(session.id, [offer])).get("", _NOT_FLUSHED)
        return await self._batches.add(session.id, event.key, offer)

    async def _flush_batch(self, session_id: str, offers: Sequence[_Offer]) -> dict[str, Settled]:
        """Claim every result of the batch, deliver the claimed ones as ONE wake-up and
        settle each claim by its answer; returns each result's outcome by its key."""
        # The newest routing of the session: every offer names the same one.
        session = offers[-1].session

        async def deliver(events: Sequence[CompletionEvent]) -> Verdict:
            target = self.targets.get(session_platform(session))
            if not isinstance(target, BatchTarget):
                raise WakeDeliveryError(
                    f"no delivery target for {session_platform(session).value} sessions in "
                    "this process",
                    transient=True,
                )
            await target.deliver_batch(events, session)
            return Verdict.delivered()

        return await self.settler.run(session_id, [offer.event for offer in offers], deliver)

    def _route(self, event: CompletionEvent) -> tuple[str, str | None, SessionRecord | None]:
        """("session", id, record) | ("gone", id, None) | ("foreign" | "unknown", None, None)."""
        # An abandoned unit's routing fields are its work's (the wrapper repeats them).
        work = getattr(event, "work", None) or event
        candidates = (
            ("origin_session_id", event.origin_session_id),
            ("parent_session_id", getattr(work, "parent_session_id", None)),
        )
        for field, session_id in candidates:
            if not isinstance(session_id, str) or not session_id:
                continue
            session = self.store.get_session(session_id)
            if session is not None:
                if self._adopted(session, event):
                    return "gone", session_id, None
                return "session", session_id, session
            if field == "origin_session_id":
                return "gone", session_id, None
        key = event.session_key
        # A re-offered event only goes where it names explicitly; a key is looked up only
        # for live events (the key of an API session embeds its id anyway).
        if isinstance(key, str) and key and not event.restored:
            session = self.store.find_session_by_key(key)
            if session is not None and not self._adopted(session, event):
                return "session", session.id, session
            if key.startswith(_API_SESSION_KEY_PREFIX):
                return "gone", key[len(_API_SESSION_KEY_PREFIX) :], None
        if event.origin_ui_session_id:
            return "foreign", None, None
        return "unknown", None, None

    @staticmethod
    def _adopted(session: SessionRecord, event: CompletionEvent) -> bool:
        """True when ``session`` was created after the work started: a new session that
        reuses a dead one's id (derived ids repeat) must not adopt its results."""
        dispatched = event.dispatched_at
        if not isinstance(dispatched, int | float) or isinstance(dispatched, bool):
            return False
        return session.created_at > float(dispatched) + _ADOPTION_SLACK_SECONDS

    def register_target(self, platform: Platform, target: DeliveryTarget | ClaimingTarget) -> None:
        """Deliver completions of ``platform``'s sessions through ``target``; a
        ``ClaimingTarget`` is offered them unclaimed (it claims and settles by itself)."""
        if isinstance(target, ClaimingTarget):
            self.claiming_targets[platform] = target
        else:
            self.targets[platform] = target

    async def _offer(self, platform: Platform, event: CompletionEvent) -> Settled:
        target = self.claiming_targets.get(platform)
        if target is None:
            # Not this process's surface: the process that serves it takes the offer.
            logger.debug("completion %s belongs to another surface", event.key)
            return Settled("foreign")
        return Settled(await target.offer(event))

    async def _deliver(self, event: CompletionEvent, session: SessionRecord) -> None:
        # The record _route read: a session deleted since then is noticed by the target
        # (SessionGone from the transcript write, 404 from the wake self-POST).
        platform = session_platform(session)
        target = self.targets.get(platform)
        if target is None:
            # Not a loss: a process that serves this platform takes it on a later offer.
            raise WakeDeliveryError(
                f"no delivery target for {platform.value} sessions in this process",
                transient=True,
            )
        await target.deliver(event, session)

    async def _refuse_unknown_type(self, evt: dict[str, Any]) -> Settled:
        """A completion of an unknown or missing ``type`` would become a wake-up of generic
        text that says nothing: it is refused here. A ledger row is dropped with the reason
        (``reveille deliveries`` shows it), anything else is logged and ignored."""
        kind = evt.get("type")
        reason = f"unknown completion event type {str(kind)[:80]!r}: not delivered"
        event = parse_event(evt)
        if not event.key:
            logger.warning("ignoring a completion without an id: %s", reason)
            return Settled("ignored")

        async def refuse(_: Sequence[CompletionEvent]) -> Verdict:
            return Verdict.dropped(reason)

        results = await self.settler.run(event.key, [event], refuse)
        return Settled("held" if results[event.key].outcome == "held" else "ignored")


def _safe_id(evt: Any) -> Any:
    return _event_id(evt) or type(evt).__name__
