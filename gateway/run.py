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

A refusal releases the claim: with ``retryable=True`` only when it was transient (429 after
the retries, 503, the server restarting, no target for the platform in this process); a
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

import tools.async_delegation as ad
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
from gateway.session import SessionGone, SessionRecord, SessionStore
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

    key: str
    evt: dict[str, Any]
    event: CompletionEvent
    session: SessionRecord


@dataclass(frozen=True)
class _Settled:
    """What became of one result of a combined wake-up."""

    outcome: str
    claimed: bool = False
    retryable: bool = False


_NOT_FLUSHED = _Settled("held")  # shut down before its batch ran: nothing was claimed


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
        self._batches: Coalescer[_Offer, _Settled] = Coalescer(
            self._flush_batch,
            window=coalesce_seconds,
            missing=_NOT_FLUSHED,
            siblings=siblings_running,
        )

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        if self._watcher is None:
            self._watcher = asyncio.create_task(self._watch(), name="completion-watcher")

    async def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None
        if self._handlers:
            # Deliveries in flight get a moment; a cancelled one keeps its ledger row
            # pending (its claim lapses and it is offered again).
            await finish_or_cancel(self._handlers, self._grace)
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
        seen: dict[str, Any] = {}
        started = time.monotonic()
        with traces.delivery_span(evt):
            outcome = await self._handle_event(evt, seen)
            traces.note_outcome("retryable" if seen.get("retryable") else outcome)
        platform = seen.get("platform")
        logger.info(
            "delivery %s: %s%s (%.0f ms)",
            _safe_id(evt),
            "retryable" if seen.get("retryable") else outcome,
            f" via {platform.value}" if platform is not None else "",
            (time.monotonic() - started) * 1000,
        )
        observer = self._on_outcome
        if observer is not None:
            try:
                completed = evt.get("completed_at") if isinstance(evt, dict) else None
                observer(
                    DeliveryOutcome(
                        outcome="retryable" if seen.get("retryable") else outcome,
                        platform=seen.get("platform"),
                        claimed=bool(seen.get("claimed")),
                        completed_at=completed if isinstance(completed, int | float) else None,
                        event=evt if isinstance(evt, dict) else {},
                    )
                )
            except Exception:
                logger.exception("the delivery outcome observer failed")
        return outcome

    async def _handle_event(self, evt: dict[str, Any], seen: dict[str, Any]) -> str:
        """Route, claim, deliver and settle one completion; returns what happened.

        The wire dict is parsed once, here: routing and the delivery target read the typed
        event; the contract calls (claim, complete, release, drop) get the wire dict.
        """
        if not isinstance(evt, dict):
            logger.error("ignoring a completion that is not a dict: %r", type(evt).__name__)
            return "ignored"
        if evt.get("type") not in DELIVERABLE_TYPES:
            return await self._refuse_unknown_type(evt)
        event = parse_event(evt)  # a mapping always parses (unknown types are generic)
        if event.origin_ui_session_id:
            # The web UI's: ``origin_ui_session_id`` is final, and its consumer claims.
            seen["platform"] = Platform.WEBUI
            return await self._offer(Platform.WEBUI, evt)
        route, session_id, session = await asyncio.to_thread(self._route, event)
        if route == "session" and session is not None:
            claiming = session_platform(session)
            if claiming in self.claiming_targets:
                seen["platform"] = claiming
                return await self._offer(claiming, evt)
            if isinstance(self.targets.get(claiming), BatchTarget):
                seen["platform"] = claiming
                return await self._coalesce(evt, event, session, seen)
        if route == "foreign":
            logger.debug("completion %s belongs to another surface", _event_id(evt))
            return "foreign"

        if session is not None:
            seen["platform"] = session_platform(session)
        claim = await self._claim(evt)
        if claim is None:
            return "held"  # someone else holds it, or it is settled already
        seen["claimed"] = True
        if route == "gone":
            await self._drop(evt, claim, f"session {session_id} no longer exists")
            return "dropped"
        if route == "unknown" or session_id is None or session is None:
            logger.warning(
                "completion %s has no known origin session; released, not delivered elsewhere",
                _event_id(evt),
            )
            await self._release(evt, claim, retryable=False)
            return "released"

        try:
            await self._deliver(event, session)
        except SessionGone as exc:
            await self._drop(evt, claim, exc.reason or f"session {session_id} was deleted")
            return "dropped"
        except WakeDeliveryError as exc:
            if exc.status == 404:
                await self._drop(evt, claim, f"session {session_id} was deleted")
                return "dropped"
            logger.warning("wake for %s not delivered: %s", _event_id(evt), exc)
            seen["retryable"] = exc.transient
            await self._release(evt, claim, retryable=exc.transient)
            return "released"
        except asyncio.CancelledError:
            # Shutting down: give the claim back without spending an attempt.
            with contextlib.suppress(Exception):
                await asyncio.shield(self._release(evt, claim, retryable=True))
            raise
        except Exception:
            logger.exception("delivery of %s failed", _event_id(evt))
            await self._release(evt, claim, retryable=False)
            return "released"
        if not await self._complete(evt, claim):
            logger.warning("completion %s was delivered but its claim had lapsed", _event_id(evt))
        return "delivered"

    # ----------------------------------------------------------------- combined wake-ups

    async def _coalesce(
        self,
        evt: dict[str, Any],
        event: CompletionEvent,
        session: SessionRecord,
        seen: dict[str, Any],
    ) -> str:
        key = _event_id(evt)
        if key is None:
            # No ledger row to claim or to dedupe by: delivered on its own, as before.
            settled = await self._flush_batch(session.id, [_Offer("", evt, event, session)])
            result = settled.get("", _NOT_FLUSHED)
        else:
            result = await self._batches.add(session.id, key, _Offer(key, evt, event, session))
        seen["claimed"] = result.claimed
        seen["retryable"] = result.retryable
        return result.outcome

    async def _flush_batch(self, session_id: str, offers: Sequence[_Offer]) -> dict[str, _Settled]:
        """Claim every result of the batch, deliver the claimed ones as ONE wake-up and
        settle each claim by its answer; returns each result's outcome by its key."""
        results: dict[str, _Settled] = {}
        claimed: list[tuple[_Offer, str]] = []
        try:
            for offer in offers:
                claim = await self._claim(offer.evt)
                if claim is None:
                    results[offer.key] = _Settled("held")  # someone else holds it, or settled
                else:
                    claimed.append((offer, claim))
        except BaseException:
            # The store failed or we are shutting down mid-batch: the claims taken so far go
            # back without an attempt spent (the rest were never claimed).
            with contextlib.suppress(Exception):
                await asyncio.shield(self._settle_all(claimed, retryable=True))
            raise
        if not claimed:
            return results
        # The newest routing of the session: every offer names the same one.
        session = claimed[-1][0].session
        settled = await self._deliver_batch(session, claimed)
        results.update({offer.key: settled for offer, _ in claimed})
        return results

    async def _deliver_batch(
        self, session: SessionRecord, claimed: Sequence[tuple[_Offer, str]]
    ) -> _Settled:
        if len(claimed) > 1:
            logger.info(
                "combining %d results into one wake-up of session %s: %s",
                len(claimed),
                session.id,
                ", ".join(offer.key for offer, _ in claimed),
            )
        target = self.targets.get(session_platform(session))
        try:
            if not isinstance(target, BatchTarget):
                raise WakeDeliveryError(
                    f"no delivery target for {session_platform(session).value} sessions in "
                    "this process",
                    transient=True,
                )
            await target.deliver_batch([offer.event for offer, _ in claimed], session)
        except SessionGone as exc:
            await self._settle_all(claimed, drop=exc.reason or f"session {session.id} was deleted")
            return _Settled("dropped", claimed=True)
        except WakeDeliveryError as exc:
            if exc.status == 404:
                await self._settle_all(claimed, drop=f"session {session.id} was deleted")
                return _Settled("dropped", claimed=True)
            logger.warning("wake-up of session %s not delivered: %s", session.id, exc)
            await self._settle_all(claimed, retryable=exc.transient)
            return _Settled("released", claimed=True, retryable=exc.transient)
        except asyncio.CancelledError:
            # Shutting down: give every claim back without spending an attempt.
            with contextlib.suppress(Exception):
                await asyncio.shield(self._settle_all(claimed, retryable=True))
            raise
        except Exception:
            logger.exception("wake-up of session %s failed", session.id)
            await self._settle_all(claimed, retryable=False)
            return _Settled("released", claimed=True)
        for offer, claim in claimed:
            if claim and not await self._complete(offer.evt, claim):
                logger.warning("completion %s was delivered but its claim had lapsed", offer.key)
        return _Settled("delivered", claimed=True)

    async def _settle_all(
        self,
        claimed: Sequence[tuple[_Offer, str]],
        *,
        retryable: bool = False,
        drop: str | None = None,
    ) -> None:
        """The one rule a single refusal follows, applied to every claim of the batch."""
        for offer, claim in claimed:
            if not claim:
                continue
            if drop is not None:
                await self._drop(offer.evt, claim, drop)
            else:
                await self._release(offer.evt, claim, retryable=retryable)

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

    async def _offer(self, platform: Platform, evt: dict[str, Any]) -> str:
        target = self.claiming_targets.get(platform)
        if target is None:
            # Not this process's surface: the process that serves it takes the offer.
            logger.debug("completion %s belongs to another surface", _event_id(evt))
            return "foreign"
        return await target.offer(evt)

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

    async def _refuse_unknown_type(self, evt: dict[str, Any]) -> str:
        """A completion of an unknown or missing ``type`` would become a wake-up of generic
        text that says nothing: it is refused here. A ledger row is dropped with the reason
        (``reveille deliveries`` shows it), anything else is logged and ignored."""
        kind = evt.get("type")
        reason = f"unknown completion event type {str(kind)[:80]!r}: not delivered"
        if _event_id(evt) is None:
            logger.warning("ignoring a completion without an id: %s", reason)
            return "ignored"
        claim = await self._claim(evt)
        if claim is None:
            return "held"
        await self._drop(evt, claim, reason)
        return "ignored"

    # ----------------------------------------------------------------- the contract

    async def _claim(self, evt: dict[str, Any]) -> str | None:
        return await ad.aclaim_event_delivery(evt, self.consumer)

    async def _complete(self, evt: dict[str, Any], claim: str) -> bool:
        return bool(await ad.acomplete_event_delivery(evt, claim))

    async def _release(self, evt: dict[str, Any], claim: str, *, retryable: bool) -> None:
        try:
            await ad.arelease_event_delivery(evt, claim, retryable=retryable)
        except Exception:
            logger.exception("could not release the claim on %s", _event_id(evt))

    async def _drop(self, evt: dict[str, Any], claim: str, reason: str) -> None:
        logger.info("dropping delivery of %s: %s", _event_id(evt), reason)
        try:
            await asyncio.to_thread(ad.drop_event_delivery, evt, claim or None, reason)
        except Exception:
            logger.exception("could not drop %s", _event_id(evt))


def _safe_id(evt: Any) -> Any:
    return _event_id(evt) or type(evt).__name__
