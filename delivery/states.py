"""Lifecycle and delivery states of a ledger row, and which of them are final."""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    """Where the background work itself is."""

    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    ERROR = "error"
    INTERRUPTED = "interrupted"
    CANCELLED = "cancelled"
    STALLED = "stalled"
    UNKNOWN = "unknown"


class DeliveryState(StrEnum):
    """Where the completion of that work is on its way into the conversation."""

    PENDING = "pending"
    DELIVERED = "delivered"
    DROPPED = "dropped"
    SUPERSEDED = "superseded"


ACTIVE_STATES = frozenset({State.QUEUED, State.RUNNING})
TERMINAL_STATES = frozenset(set(State) - ACTIVE_STATES)
SETTLED_DELIVERY_STATES = frozenset(
    {DeliveryState.DELIVERED, DeliveryState.DROPPED, DeliveryState.SUPERSEDED}
)

# The lifecycle moves only forward along these edges; every durable transition is a
# compare-and-set from one of these sources.
ALLOWED_TRANSITIONS: dict[State, frozenset[State]] = {
    State.QUEUED: frozenset({State.RUNNING, State.CANCELLED, State.INTERRUPTED}),
    State.RUNNING: frozenset(TERMINAL_STATES),
}


def can_transition(current: str, new: str) -> bool:
    return State(new) in ALLOWED_TRANSITIONS.get(State(current), frozenset())
