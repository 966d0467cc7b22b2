"""The storage interface of the Responses API: one row per response, its streamed events.

A response (``POST /v1/responses``) is a row written BEFORE its work starts, so that any
server sharing the store can answer for it, run it, take it over or end it. Its ``status``
moves ``queued -> in_progress -> completed | failed | cancelled | incomplete``; every move
is a compare-and-set (``transition``: the expected statuses, and for a running response its
``owner``), so a server that lost its lease (cancelled meanwhile, taken over as dead) can no
longer write. A running response's owner renews ``lease_until``; a row whose lease ran out
is another server's to end. ``body`` is the OpenAI Response object as last written (JSON
text; ``gateway.openai.response_object`` shapes it), ``request`` the checked request
(JSON: the input items with their ids, the options), so the row alone can be run anywhere.

Events of background responses are stored in order (``append_events`` numbers them inside
its own transaction, fenced by the owner) so that a stream can be resumed from any server
after any sequence number. The stored event data carries no ``sequence_number``: the
number is the row's ``seq``, added when the event is sent.

A cancel and the store of a finished turn are ordered through ``owner``: the runner's
first step of the store is a compare-and-set to ``storing_owner(owner)`` (still
``in_progress``), and a cancel is a compare-and-set on the owner it read. So exactly one
wins: a cancel that moved the row first leaves nothing to store; a row whose store began
ends ``completed`` (or ``failed``), and its cancel answers with that.

``notified`` marks a terminal row whose terminal hook (webhooks) ran; rows that end without
it (a crash in between) are offered to the hook again, so the hook runs at least once.
Retention (``prune``, run by ``delivery.retention`` for ``[responses] keep_days``) never
removes a queued or running response, nor a terminal one whose hook has not run yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from delivery.notifier import Notifier

__all__ = [
    "ACTIVE",
    "TERMINAL",
    "Change",
    "QueueCaps",
    "QueueFull",
    "ResponseEvent",
    "ResponseRow",
    "ResponsesBackend",
    "is_storing",
    "storing_owner",
]

ACTIVE = ("queued", "in_progress")
TERMINAL = ("completed", "failed", "cancelled", "incomplete")
_STORING = "!storing"


def storing_owner(owner: str) -> str:
    """The owner a running row gets once its finished turn is being stored: a cancel that
    read the owner before can no longer move it, and one that reads it now loses."""
    return owner + _STORING


def is_storing(owner: str | None) -> bool:
    """Whether the row's finished turn is being stored (see ``storing_owner``)."""
    return owner is not None and owner.endswith(_STORING)


@dataclass(frozen=True, slots=True)
class ResponseRow:
    """One stored response (see the module docstring)."""

    id: str
    status: str
    background: bool
    session_id: str
    request: str  # JSON: the checked request
    body: str  # JSON: the Response object as last written
    created_at: float
    updated_at: float
    previous_response_id: str | None = None
    owner: str | None = None
    lease_until: float = 0.0
    completed_at: float | None = None
    idempotency_key: str | None = None
    fingerprint: str | None = None
    notified: bool = False
    caller: str | None = None  # who asked (a digest of its key, never the key): queue caps


@dataclass(frozen=True, slots=True)
class QueueCaps:
    """How many rows may be queued: those of one caller, and all of them."""

    per_caller: int
    total: int


class QueueFull(Exception):
    """An insert beyond ``QueueCaps``: the caller's own (``per_key``) or all."""

    def __init__(self, message: str, *, per_key: bool) -> None:
        super().__init__(message)
        self.per_key = per_key


@dataclass(frozen=True, slots=True)
class ResponseEvent:
    """One stored stream event: its number, its type, its data (JSON, no number in it)."""

    seq: int
    type: str
    data: str


@dataclass(frozen=True, slots=True)
class Change:
    """What a ``transition`` writes: the new status and body, who owns the row now (None
    clears it), until when, and when it ended (terminal statuses)."""

    status: str
    body: str
    owner: str | None = None
    lease_until: float = 0.0
    completed_at: float | None = None
    notified: bool = False  # nothing to tell (no terminal hook): never offered to one


class ResponsesBackend(Protocol):
    """The responses table and its events in one store (SQLite, PostgreSQL, memory).

    Every method is synchronous and may block: async callers run them in a thread.
    """

    @property
    def notifier(self) -> Notifier:
        """Pokes every server sharing the store (a response changed or has new events)."""

    def insert(
        self, row: ResponseRow, events: list[tuple[str, str]], caps: QueueCaps | None = None
    ) -> ResponseRow:
        """Write a new row (and its first events, numbered from 0) in one transaction.
        When a row with the same ``idempotency_key`` exists, nothing is written and that
        row is returned instead. With ``caps``, a row that would queue one too many (its
        ``caller``'s, or in all) is refused with ``QueueFull``, counted in the same
        transaction (a repeated idempotency key is answered first, never refused)."""

    def get(self, response_id: str) -> ResponseRow | None: ...

    def queued(self, caller: str | None) -> tuple[int, int]:
        """How many rows are queued in all, and how many of them ``caller``'s."""

    def transition(
        self,
        response_id: str,
        *,
        expect: tuple[str, ...],
        owner: str | None,
        change: Change,
        events: list[tuple[str, str]] | None = None,
        check_owner: bool = True,
    ) -> bool:
        """Compare-and-set: when the row's status is in ``expect`` (and, with
        ``check_owner``, its owner is ``owner``), write ``change`` and append ``events``
        after the stored ones, in one transaction. False when the row moved on or is gone."""

    def append_events(self, response_id: str, owner: str, events: list[tuple[str, str]]) -> bool:
        """Append events after the stored ones while ``owner`` runs the row (in_progress,
        storing its turn or not); False (nothing written) otherwise."""

    def renew(self, response_id: str, owner: str, lease_until: float) -> bool:
        """Extend the lease of a row ``owner`` runs (storing its turn or not); False when it
        no longer does."""

    def events_after(self, response_id: str, after: int, limit: int) -> list[ResponseEvent]:
        """Stored events with ``seq > after``, in order, at most ``limit``."""

    def active(self, limit: int) -> list[ResponseRow]:
        """Queued and running rows, oldest first (the workers' candidates)."""

    def unnotified(self, limit: int) -> list[ResponseRow]:
        """Terminal rows whose terminal hook has not run yet, oldest first."""

    def status_counts(self) -> dict[str, int]:
        """How many stored responses have each status (the ``reveille_responses`` metric)."""

    def mark_notified(self, response_id: str) -> None: ...

    def delete(self, response_id: str) -> bool:
        """Remove the row and its events; False when there was none."""

    def prune(self, before: float, limit: int, *, dry_run: bool = False) -> int:
        """Remove at most ``limit`` terminal rows that ended before ``before``, with their
        events (``dry_run``: only count them); never a queued or running one, nor one whose
        terminal hook has not run yet (``notified``). Returns how many rows went."""

    def close(self) -> None: ...
