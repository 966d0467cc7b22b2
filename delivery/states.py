"""Lifecycle and delivery states of a ledger row, and every edge between them.

A row has two state machines: ``state`` (where the background work is) and
``delivery_state`` (where its completion is on its way into the conversation). Every edge
is a compare-and-set in ``delivery.ledger`` (``WHERE`` the expected state still holds), so
of two racing writers exactly one takes it.

Lifecycle (``state``)::

    from       to                     who takes it
    ---------  ---------------------  -----------------------------------------------------
    (none)     queued | running       dispatch (``Ledger.create``): running when a slot is
                                      free, queued in the bounded FIFO otherwise; the row is
                                      written before the work can start (a failed write
                                      rejects the dispatch). Background processes start
                                      running.
    queued     running                worker takes the unit from the FIFO (``Ledger.start``)
    queued     cancelled              cancel of a unit that has not started (``finish``)
    queued     interrupted            recovery of abandoned work: its owner process died
                                      before it started (``recover_abandoned``; safe to run
                                      again)
    running    completed | failed |   worker (``finish``) with the runner's status (a
               error | cancelled |    cancel requested while it ran gives cancelled; an
               interrupted | unknown  unknown status or a crash of the runner gives error;
               | stalled              a sub-agent stopped by its stall limit gives stalled)
    running    unknown                recovery of abandoned work: its owner died while it
                                      ran (it may have had effects)

    Terminal states never change again. ``finish`` writes the completion event with the
    terminal state in the same commit, before anyone is told.

Delivery (``delivery_state``; "claimed" is pending with a live ``claim_token``)::

    from       to         who takes it
    ---------  ---------  ------------------------------------------------------------------
    (none)     pending    dispatch (no event yet: nothing to claim until ``finish``)
    pending    pending    finish: the event is stored, ``due_at`` set (delivery may begin)
    pending    claimed    claim (``Ledger.claim``): pending, has an event, no live claim (or
                          its holder died), past its backoff, under the attempt budget;
                          counts one attempt, lease 300 s
    pending    dropped    claim at budget exhaustion (attempts >= max, e.g. after leases
                          ran out): dropped at that claim instead of counting a ninth
    claimed    delivered  complete with the matching token (``Ledger.complete``); a repeat
                          is a no-op
    claimed    pending    release with the matching token: backoff before the next claim;
                          ``retryable=True`` refunds the attempt (not the delivery's fault)
    claimed    dropped    release that spends the last counted attempt (budget exhaustion),
                          or any release past the replay cap (48 h)
    pending    dropped    drop: the target is gone for good (session deleted, user reset,
                          an operator's ``reveille deliveries drop``, a process started
                          with notify_on_complete off); works with or without the claim
    pending    pending    restore after a restart / orphan re-offer (``restore``,
                          ``take_due``): this process becomes the holder and offers the
                          event again (marked restored); an expired or dead holder's claim
                          is voided; a live claim of a live process is left alone
    pending    dropped    restore / orphan re-offer past the replay cap (48 h): dropped
                          instead of replayed
    dropped    dropped    finish of work dropped while it ran: the result is stored and
                          stays queryable, nothing is queued
    dropped    pending    operator redeliver (``Ledger.redeliver``): only a dropped row
                          with an event; a fresh budget, recorded in the audit log

    delivered is final. Results of dropped rows stay queryable.

No other states exist: SPEC.md's ``superseded`` (delivery) is produced by no code path (no
writer, no reader), so it is not in the enums below, and renderers do not special-case it.
Work abandoned by a dead owner is reported with ``interrupted``/``unknown`` and the event
``delivery.recovery.abandoned_event`` writes (``delivery.events.AbandonedWork`` when parsed).
"""

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
    UNKNOWN = "unknown"
    STALLED = "stalled"


class DeliveryState(StrEnum):
    """Where the completion of that work is on its way into the conversation."""

    PENDING = "pending"
    DELIVERED = "delivered"
    DROPPED = "dropped"


ACTIVE_STATES = frozenset({State.QUEUED, State.RUNNING})
TERMINAL_STATES = frozenset(set(State) - ACTIVE_STATES)
SETTLED_DELIVERY_STATES = frozenset({DeliveryState.DELIVERED, DeliveryState.DROPPED})

# The lifecycle moves only forward along these edges (the table above); every durable
# transition is a compare-and-set from one of these sources.
ALLOWED_TRANSITIONS: dict[State, frozenset[State]] = {
    State.QUEUED: frozenset({State.RUNNING, State.CANCELLED, State.INTERRUPTED}),
    State.RUNNING: frozenset(TERMINAL_STATES),
}


def can_transition(current: str, new: str) -> bool:
    return State(new) in ALLOWED_TRANSITIONS.get(State(current), frozenset())
