"""What the webhook sender needs from a store: outgoing webhooks as durable obligations.

A webhook event is written to the store BEFORE anything is sent, one row per (event,
endpoint), so a crash or a receiver that is down loses nothing: the row stays ``pending``
until one send to that endpoint answers 2xx (``delivered``), the endpoint answers 410 Gone
or the retry window ends (``dropped``). Rows are sent by whichever server claims them: a
claim is a lease (``claim_token`` until ``claim_expires_at``), taken with a compare-and-set,
so two servers never send the same row at once and a dead server's claim simply runs out.
Every send attempt is recorded, whatever its outcome (``reveille deliveries show``).

The signing secrets created by ``reveille webhooks secret`` live here too, so every server
sharing the store signs with the same ones and a rotation reaches all of them at once.

Each dialect (``storage/*/webhooks.py``) implements ``WebhookBackend`` with the same
behaviour; the rules (what an answer means, how long to wait) live in ``gateway.webhooks``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

__all__ = [
    "DELIVERED",
    "DROPPED",
    "PENDING",
    "EndpointStats",
    "Settlement",
    "WebhookAttempt",
    "WebhookBackend",
    "WebhookDelivery",
    "WebhookSecret",
]

PENDING = "pending"
DELIVERED = "delivered"
DROPPED = "dropped"


@dataclass(frozen=True, slots=True)
class WebhookDelivery:
    """One event owed to one endpoint. ``id`` is the event's delivery id (the ``webhook-id``
    header and the payload's ``id``; the same for every endpoint of one event), ``body`` the
    exact JSON sent on every attempt."""

    id: str
    endpoint: str
    event_type: str
    object_id: str
    body: str
    created_at: float
    state: str = PENDING
    attempts: int = 0
    next_attempt_at: float = 0.0
    claim_token: str | None = None
    claim_expires_at: float = 0.0
    settled_at: float | None = None
    settled_reason: str | None = None

    def with_claim(self, token: str, expires_at: float) -> WebhookDelivery:
        return replace(self, claim_token=token, claim_expires_at=expires_at)


@dataclass(frozen=True, slots=True)
class WebhookAttempt:
    """One send of a delivery to its endpoint: the HTTP status it got (None when no answer
    came: refused, timed out), the error, and what it decided (``delivered``, ``retry``,
    ``dropped``)."""

    delivery_id: str
    endpoint: str
    at: float
    consumer: str
    outcome: str
    status: int | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class WebhookSecret:
    """A signing secret (``whsec_...``); ``expires_at`` is set once a newer one replaced it."""

    secret: str
    created_at: float
    expires_at: float | None = None


@dataclass(frozen=True, slots=True)
class Settlement:
    """What an attempt leaves on its row: its new state, when to try again (pending), and
    why it settled (delivered or dropped)."""

    state: str
    next_attempt_at: float = 0.0
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class EndpointStats:
    """What one endpoint is owed and was given, read from the store (``/metrics``): rows
    pending (owed), delivered and dropped (failed: 410 or the retry window ran out), and
    when the oldest owed row's event was created (None: nothing owed)."""

    endpoint: str
    owed: int = 0
    delivered: int = 0
    failed: int = 0
    oldest_owed_at: float | None = None


class WebhookBackend(Protocol):
    def add(self, rows: Sequence[WebhookDelivery]) -> int:
        """Insert the rows (one transaction); a row whose (id, endpoint) exists is left as
        it is, so enqueueing one event twice owes it once. Returns how many were new."""
        ...

    def claim_due(
        self,
        now: float,
        consumer: str,
        token: str,
        lease_seconds: float,
        limit: int,
        *,
        endpoint: str | None = None,
    ) -> list[WebhookDelivery]:
        """Claim up to ``limit`` pending rows that are due (``next_attempt_at <= now``) and
        not under a live claim, oldest first, of ``endpoint`` only when given (the sender
        claims per endpoint, so one endpoint's backlog never stands before another's);
        each gets ``token`` until now + lease."""
        ...

    def settle(self, attempt: WebhookAttempt, token: str, settlement: Settlement) -> bool:
        """Record ``attempt`` (always: it happened) and, only while the row is pending under
        ``token``, count it and apply ``settlement`` (releasing the claim). False when the
        claim was lost (expired and taken): the row is then the new holder's."""
        ...

    def deliveries(self, delivery_id: str) -> list[WebhookDelivery]:
        """Every endpoint's row of one event (none: unknown id)."""
        ...

    def attempts(self, delivery_id: str) -> list[WebhookAttempt]:
        """Every attempt of one event, oldest first."""
        ...

    def recent(self, limit: int, state: str | None = None) -> list[WebhookDelivery]:
        """The newest rows, newest first, of one state or all."""
        ...

    def next_due_at(self, endpoint: str | None = None) -> float | None:
        """When the earliest pending row (of ``endpoint``, when given) may next be claimed
        (None: nothing pending)."""
        ...

    def endpoint_stats(self) -> list[EndpointStats]:
        """Per endpoint that has any row, by endpoint: owed, delivered, failed, oldest owed."""
        ...

    def secrets(self, now: float) -> list[WebhookSecret]:
        """The secrets valid at ``now``, newest first."""
        ...

    def rotate_secret(self, secret: str, now: float, overlap_seconds: float) -> None:
        """Make ``secret`` the current one; the ones it replaces stay valid ``overlap_seconds``
        longer (one transaction)."""
        ...

    def close(self) -> None: ...


def sort_due(rows: Sequence[WebhookDelivery]) -> list[WebhookDelivery]:
    """Claim order: oldest event first (then by endpoint, so every dialect agrees)."""
    return sorted(rows, key=lambda r: (r.created_at, r.id, r.endpoint))


def may_claim(row: WebhookDelivery, now: float, endpoint: str | None = None) -> bool:
    return (
        row.state == PENDING
        and row.next_attempt_at <= now
        and row.claim_expires_at <= now
        and (endpoint is None or row.endpoint == endpoint)
    )
