"""The settle protocol every consumer of the delivery ledger follows, written once.

Claim each, deliver once, settle all, refusals refunded:

1. ``Settler.run(label, events, deliver)`` claims every event of the batch
   (``tools.async_delegation``'s claim, one attempt each). One held by another consumer, or
   settled already, is left out ("held"); a claim the store cannot make is logged and left
   out too (its row stays pending and is offered again).
2. The claimed events are handed to ``deliver`` ONCE, as one batch. ``deliver`` is all a
   consumer plugs in (the push runner's target, the web UI's wake-up turn, the API server's
   transcript row or self-POST): it returns a ``Verdict`` or raises.
3. Every claim is settled by that one verdict, by the same rule: ``delivered`` completes
   each; ``released`` gives each back (``retryable`` refunds the attempt: the refusal was
   transient, not the delivery's fault); ``dropped`` drops each for good (the session is
   gone), with the reason; ``later`` settles each once the hand-off is stored (delivered;
   nothing stored is a refunded release), on a task ``drain`` waits for at shutdown.
   The exceptions ``deliver`` raises are verdicts too: ``SessionGone`` and a 404
   ``WakeDeliveryError`` drop, any other ``WakeDeliveryError`` releases (retryable when
   transient), anything else releases unrefunded. Cancellation (shutdown) gives every
   claim back refunded and re-raises.

The consumers: the push runner (``gateway.run``: push chats batched, the API server's
transcript rows and self-POSTed wakes one at a time, unknown types dropped) and the web UI
(``api.wakeups``, whose accepted turn settles ``later``). A webhook owed for a result is
enqueued inside the API server's ``deliver`` (``gateway.delivery_targets``), before the
claim is acknowledged (a redelivery owes it once: its id is derived); the webhook outbox itself
(``gateway.webhooks``) is another table with another contract (rows claimed by due time,
each POSTed on its own, a retry schedule instead of refunds) and settles through its store.

A settlement that fails is logged, never raised: the claim lapses by itself and the row is
offered again, so nothing is lost; a crash anywhere between claim and settle leaves the
rows pending for the same reason. The events are the typed ``CompletionEvent`` throughout;
the contract is called with their ``wire`` dicts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import tools.async_delegation as ad
from delivery.events import CompletionEvent
from gateway.session import SessionGone
from gateway.tasks import finish_or_cancel
from gateway.wake import WakeDeliveryError

__all__ = ["Claimed", "DeliverBatch", "Settled", "Settler", "Verdict"]

logger = logging.getLogger(__name__)

VerdictKind = Literal["delivered", "released", "dropped", "later"]


@dataclass(frozen=True)
class Verdict:
    """What became of one hand-off, and so of every claim of its batch."""

    kind: VerdictKind
    retryable: bool = False
    """``released``: refund the attempt (transient refusal, not the delivery's fault)."""
    reason: str = ""
    """``dropped``: why, kept on the row (``reveille deliveries`` shows it)."""
    stored: Awaitable[bool] | None = None
    """``later``: resolves once the hand-off is stored (True) or failed storing nothing."""

    @classmethod
    def delivered(cls) -> Verdict:
        return cls("delivered")

    @classmethod
    def released(cls, *, retryable: bool) -> Verdict:
        return cls("released", retryable=retryable)

    @classmethod
    def dropped(cls, reason: str) -> Verdict:
        return cls("dropped", reason=reason)

    @classmethod
    def later(cls, stored: Awaitable[bool] | None) -> Verdict:
        return cls("later", stored=stored)


@dataclass(frozen=True)
class Claimed:
    """An event this consumer holds the claim on ("" for a type that needs none)."""

    event: CompletionEvent
    claim: str


@dataclass(frozen=True)
class Settled:
    """What became of one event of a batch: ``outcome`` is ``held`` (not claimed here) or
    the verdict's kind; ``claimed`` says an attempt was taken; ``retryable`` a refund."""

    outcome: str
    claimed: bool = False
    retryable: bool = False


HELD = Settled("held")


class DeliverBatch(Protocol):
    """Hand the claimed events over as ONE delivery; the verdict settles every claim."""

    def __call__(self, events: Sequence[CompletionEvent], /) -> Awaitable[Verdict]: ...


LateHook = Callable[[Sequence[CompletionEvent]], Awaitable[None]]


class Settler:
    """The protocol for one consumer (``consumer`` names it in its claims).

    ``after_late`` is awaited with the events of a ``later`` verdict once they settled (the
    web UI announces the rows' change).
    """

    def __init__(self, consumer: str, *, after_late: LateHook | None = None) -> None:
        self.consumer = consumer
        self._after_late = after_late
        self._late: set[asyncio.Task[None]] = set()

    async def run(
        self, label: str, events: Sequence[CompletionEvent], deliver: DeliverBatch
    ) -> dict[str, Settled]:
        """Claim each of ``events``, deliver the claimed ones once, settle all; each event's
        outcome by its ``key``. ``label`` names the target in log lines (a session id)."""
        results = {event.key: HELD for event in events}
        claimed = await self.claim_each(events)
        if not claimed:
            return results
        keys = [c.event.key for c in claimed]
        if len(claimed) > 1:
            logger.info(
                "combining %d results into one wake-up of %s: %s",
                len(claimed),
                label,
                ", ".join(keys),
            )
        try:
            verdict = await deliver([c.event for c in claimed])
        except asyncio.CancelledError:
            # Shutting down: every claim goes back without an attempt spent.
            with contextlib.suppress(Exception):
                await asyncio.shield(self.settle(claimed, Verdict.released(retryable=True)))
            raise
        except Exception as exc:
            verdict = _refusal(exc, label, keys)
        await self.settle(claimed, verdict)
        settled = Settled(verdict.kind, claimed=True, retryable=verdict.retryable)
        results.update({c.event.key: settled for c in claimed})
        return results

    async def claim_each(self, events: Sequence[CompletionEvent]) -> list[Claimed]:
        """The events this consumer now holds claims on; on cancellation the claims taken
        so far go back refunded (the rest were never claimed)."""
        claimed: list[Claimed] = []
        try:
            for event in events:
                try:
                    claim = await ad.aclaim_event_delivery(event.wire, self.consumer)
                except Exception:
                    logger.exception("could not claim %s", event.key)
                    continue
                if claim is not None:
                    claimed.append(Claimed(event, claim))
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(self.settle(claimed, Verdict.released(retryable=True)))
            raise
        return claimed

    async def settle(self, claimed: Sequence[Claimed], verdict: Verdict) -> None:
        """Settle every claim by ``verdict``; a ``later`` one on a task of its own."""
        if verdict.kind == "later":
            task = asyncio.create_task(self._settle_when_stored(claimed, verdict.stored))
            self._late.add(task)
            task.add_done_callback(self._late.discard)
            return
        if verdict.kind == "dropped":
            logger.info(
                "dropping delivery of %s: %s",
                ", ".join(c.event.key for c in claimed),
                verdict.reason,
            )
        for item in claimed:
            if item.claim:
                await self._settle_one(item, verdict)

    async def _settle_one(self, item: Claimed, verdict: Verdict) -> None:
        evt, claim, key = item.event.wire, item.claim, item.event.key
        try:
            if verdict.kind == "delivered":
                if not await ad.acomplete_event_delivery(evt, claim):
                    logger.warning("%s was delivered but its claim had lapsed", key)
            elif verdict.kind == "dropped":
                await asyncio.to_thread(ad.drop_event_delivery, evt, claim, verdict.reason)
            else:
                await ad.arelease_event_delivery(evt, claim, retryable=verdict.retryable)
        except Exception:
            # The claim lapses by itself and the row is offered again: nothing is lost.
            logger.exception("could not settle the claim on %s", key)

    async def _settle_when_stored(
        self, claimed: Sequence[Claimed], stored: Awaitable[bool] | None
    ) -> None:
        # Settled once the hand-off is stored, not when it starts: a server that dies
        # meanwhile leaves every row pending, and their re-offer replays it (keyed by the
        # batch's delivery ids) once.
        ok = True if stored is None else await stored
        if not ok:
            # Nothing was stored (the model failed): not the delivery's fault, so the
            # attempt is refunded and the rows are offered again.
            logger.info(
                "wake-up %s stored nothing; offered again later",
                ", ".join(c.event.key for c in claimed),
            )
        await self.settle(claimed, Verdict.delivered() if ok else Verdict.released(retryable=True))
        if self._after_late is not None:
            await self._after_late([c.event for c in claimed])

    async def drain(self, grace_seconds: float) -> None:
        """Let the ``later`` settlements in flight finish (at shutdown); what is still open
        after ``grace_seconds`` lapses and is offered again."""
        await finish_or_cancel(self._late, grace_seconds)


def _refusal(exc: Exception, label: str, keys: Sequence[str]) -> Verdict:
    """The verdict an exception of ``deliver`` stands for."""
    if isinstance(exc, SessionGone):
        return Verdict.dropped(exc.reason or f"session {label} was deleted")
    if isinstance(exc, WakeDeliveryError):
        if exc.status == 404:
            return Verdict.dropped(f"session {label} was deleted")
        logger.warning("wake-up of %s not delivered: %s", label, exc)
        return Verdict.released(retryable=exc.transient)
    logger.exception("delivery of %s to %s failed", ", ".join(keys), label, exc_info=exc)
    return Verdict.released(retryable=False)
