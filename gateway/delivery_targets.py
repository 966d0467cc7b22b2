"""Delivery targets: how a completion reaches a session, one target per surface (``Platform``).

The runner parses a completion once, routes it to its origin session, then hands the typed
event to the target registered for the platform that session came through:

* ``ApiServerTarget`` (``Platform.API_SERVER``): a delegation result becomes a delivery row
  in the transcript (the client's next turn folds it in), then, with webhooks configured, a
  ``reveille.delegation.completed`` webhook owed to every endpoint (the client may have
  walked away; the webhook tells it to come back); any other completion wakes the
  session with a new turn through ``deliver_wake``'s self-POST, carrying the delivery id as
  its ``Idempotency-Key``.
* ``PushTarget`` (chat platforms): ``deliver_wake``'s push path, an internal
  ``MessageEvent`` handed to the adapter's ``handle_message``. It is a ``BatchTarget``: the
  runner gathers a session's results that arrive together (``gateway.coalesce``) and hands
  them over as ONE wake-up (``deliver_batch``, one text within the wake-up text budget).

* A ``ClaimingTarget`` (the web UI, ``Platform.WEBUI``, registered by the composition
  root) is offered the typed event unclaimed: it checks its session's busy state
  BEFORE claiming, claims, delivers and settles by itself, so a busy session is a wait and
  never an attempt. The runner hands it every completion that names
  ``origin_ui_session_id`` (that field is final) and every one routed to one of its sessions.

A target raises ``SessionGone`` when the session is gone for good (the delivery is dropped,
the result stays in the ledger) and ``WakeDeliveryError`` when the hand-off was refused (the
claim is released, with ``retryable`` when it was transient). Any other exception is a
release too: only the domain error means "drop". The rule is ``gateway.settle``'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from delivery.events import ASYNC_DELEGATION, CompletionEvent, ScheduledWakeupEvent, delivery_id
from gateway.config import Platform
from gateway.session import SessionRecord, SessionSource, SessionStore
from gateway.wake import (
    deliver_wake,
    format_wake_text,
    persist_delegation_delivery,
    persist_wakeup_delivery,
)
from gateway.wake_text import DEFAULT_WAKE_TEXT_BUDGET, format_wake_batch, wake_batch_key
from gateway.webhooks import DELEGATION_COMPLETED, WebhookSender

__all__ = [
    "ApiServerTarget",
    "BatchTarget",
    "ClaimingTarget",
    "DeliveryTarget",
    "PushTarget",
    "session_platform",
]


class DeliveryTarget(Protocol):
    async def deliver(self, event: CompletionEvent, session: SessionRecord) -> None:
        """Hand ``event`` to ``session`` (a session-store record); return once it was accepted."""
        ...


@runtime_checkable
class BatchTarget(Protocol):
    async def deliver(self, event: CompletionEvent, session: SessionRecord) -> None: ...

    async def deliver_batch(
        self, events: Sequence[CompletionEvent], session: SessionRecord
    ) -> None:
        """Hand ``events`` (one or more results of ``session``) over as ONE wake-up; return
        once it was accepted. Raises like ``deliver``, for the whole batch."""
        ...


@runtime_checkable
class ClaimingTarget(Protocol):
    async def offer(self, event: CompletionEvent) -> str:
        """Take an unclaimed completion and settle it (``gateway.settle``); returns what
        happened ("started", "deferred", "held", ...)."""
        ...


class ApiServerTarget:
    """Transcript rows for delegations and wake-ups the agent set, self-POSTed wake turns
    for everything else."""

    def __init__(
        self, store: SessionStore, adapter: Any, webhooks: WebhookSender | None = None
    ) -> None:
        self.store = store
        self.adapter = adapter
        self.webhooks = webhooks

    async def deliver(self, event: CompletionEvent, session: SessionRecord) -> None:
        session_id = session.id
        text = format_wake_text(event)
        if event.type == ASYNC_DELEGATION:
            await asyncio.to_thread(
                persist_delegation_delivery, self.store, session_id, event, text
            )
            delegation_id = delivery_id(event, strict=False)
            if self.webhooks is not None and delegation_id:
                # After the row is stored, before the delivery is acknowledged: a failed
                # write here releases the claim, and the redelivery owes the webhook once
                # (the transcript row and the webhook's id are both keyed on the delegation).
                await self.webhooks.aenqueue(DELEGATION_COMPLETED, delegation_id)
            return
        if isinstance(event, ScheduledWakeupEvent):
            await asyncio.to_thread(persist_wakeup_delivery, self.store, session_id, event, text)
            return
        await deliver_wake(
            self.adapter,
            text=text,
            session_id=session_id,
            idempotency_key=delivery_id(event, strict=False),
        )


class PushTarget:
    """A push-capable chat adapter: the wake-up is a real turn in the chat it came from.
    Results delivered together are one turn, keyed by ``wake_batch_key`` of their ids (the
    delivery id itself for one), so a re-offer of a wake-up that ran replays it."""

    def __init__(self, adapter: Any, *, wake_text_budget: int = DEFAULT_WAKE_TEXT_BUDGET) -> None:
        self.adapter = adapter
        self.wake_text_budget = wake_text_budget

    async def deliver(self, event: CompletionEvent, session: SessionRecord) -> None:
        await self.deliver_batch([event], session)

    async def deliver_batch(
        self, events: Sequence[CompletionEvent], session: SessionRecord
    ) -> None:
        raw_source = session.source
        if not isinstance(raw_source, Mapping):
            raise ValueError(f"session {session.id!r} has no source to push to")
        ids = [i for e in events if (i := delivery_id(e, strict=False))]
        await deliver_wake(
            self.adapter,
            text=format_wake_batch(events, budget=self.wake_text_budget),
            source=SessionSource.from_dict(raw_source),
            session_id=session.id,
            idempotency_key=wake_batch_key(ids) if ids else None,
        )


def session_platform(session: SessionRecord) -> Platform:
    """The surface a session came through; sessions stored without a source are API ones."""
    source = session.source
    if isinstance(source, Mapping):
        try:
            return Platform(str(source.get("platform")))
        except ValueError:
            pass
    return Platform.API_SERVER
