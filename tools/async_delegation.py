"""Detached sub-agent work and the durable delivery contract every front end uses.

Dispatch: ``dispatch_async_delegation`` writes the ledger row first (a failed write rejects
the dispatch), then runs ``runner`` on a daemon worker; at most ``max_async_children``
units run at once, and beyond that a dispatch waits in a bounded FIFO or is rejected. When
the runner returns, the terminal state and the completion event are written to the ledger
BEFORE the event is put on ``process_registry.completion_queue``.

Delivery: a consumer claims an event before handing it on, acknowledges it only after the
hand-off was accepted, and otherwise releases it (``retryable=True`` when the refusal was
transient). Those calls, and restore after a restart, are the public contract of SPEC.md.

This module is that contract's stable import path: requests are built and checked here and
handed to the process's ``DelegationRuntime`` (``tools.delegation_runtime``), whose opening
functions are re-exported here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from agent.messages import JSONObject, JSONValue
from delivery.errors import ClaimMismatchError
from delivery.events import ASYNC_DELEGATION, delivery_id
from delivery.ids import new_id
from delivery.rows import RowQuery
from tools.completion_queue import EventQueue, WireEvent
from tools.delegation_runtime import (
    DEFAULT_MAX_QUEUED,
    DelegationRequest,
    DelegationRuntime,
    DispatchOutcome,
    Runner,
    RunnerResult,
    RuntimeFactory,
    Unit,
    configure_runtime,
    get_runtime,
    open_runtime,
    register_runtime_factory,
    reset_runtime,
    runtime_is_open,
)

__all__ = [
    "DEFAULT_MAX_QUEUED",
    "EVENT_TYPE",
    "NOT_HOLDER",
    "DelegationRequest",
    "DelegationRuntime",
    "DispatchOutcome",
    "EventQueue",
    "LedgerRow",
    "Runner",
    "RunnerResult",
    "RuntimeFactory",
    "WireEvent",
    "aclaim_event_delivery",
    "acomplete_event_delivery",
    "arelease_event_delivery",
    "cancel_delegation",
    "claim_event_delivery",
    "complete_event_delivery",
    "configure_runtime",
    "dispatch_async_delegation",
    "dispatch_async_delegation_batch",
    "drop_event_delivery",
    "get_durable_delegation",
    "get_runtime",
    "interrupt_delegation",
    "list_delegations",
    "open_runtime",
    "register_runtime_factory",
    "release_event_delivery",
    "reset_runtime",
    "restore_undelivered_completions",
    "runtime_is_open",
]

log = logging.getLogger(__name__)

EVENT_TYPE = ASYNC_DELEGATION  # the one literal lives in delivery.events

LedgerRow = JSONObject
"""A ledger row as this contract hands it out: a dict (``state``, ``delivery_state``,
``delivery_attempts``, ``event`` ...), the ``as_dict()`` of the ``delivery.rows.LedgerRow``
record the ledger reads; plugins index it, so it stays a dict."""


# -- dispatch API ------------------------------------------------------------------------------


def _new_id() -> str:
    return new_id("deleg_")


def _base_request(
    delegation_id: str,
    *,
    context: str | None,
    toolsets: list[str] | None,
    role: str | None,
    model: str | None,
    session_key: str | None,
    origin_session_id: str | None,
    origin_ui_session_id: str | None,
    parent_session_id: str | None,
) -> DelegationRequest:
    for name, value in (
        ("session_key", session_key),
        ("origin_session_id", origin_session_id),
        ("origin_ui_session_id", origin_ui_session_id),
        ("context", context),
        ("role", role),
        ("model", model),
    ):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{name} must be a string")
    if toolsets is not None and (
        not isinstance(toolsets, list) or not all(isinstance(t, str) for t in toolsets)
    ):
        raise TypeError("toolsets must be a list of strings")
    return {
        "type": EVENT_TYPE,
        "delegation_id": delegation_id,
        "session_key": session_key,
        "origin_session_id": origin_session_id,
        "origin_ui_session_id": origin_ui_session_id,
        "parent_session_id": parent_session_id,
        "context": context,
        "toolsets": toolsets or [],
        "role": role,
        "model": model,
        "dispatched_at": time.time(),
    }


def dispatch_async_delegation(
    *,
    goal: str,
    context: str | None = None,
    toolsets: list[str] | None = None,
    role: str | None = None,
    model: str | None = None,
    session_key: str | None = None,
    runner: Runner,
    interrupt_fn: Callable[[], None] | None = None,
    max_async_children: int = 3,
    origin_session_id: str | None = None,
    origin_ui_session_id: str | None = None,
    parent_session_id: str | None = None,
    max_queued_delegations: int | None = None,
) -> DispatchOutcome:
    """Start one background task; returns at once with dispatched | queued | rejected.

    Beyond ``max_async_children`` running, the task waits in the FIFO unless that holds
    ``max_queued_delegations`` (default: the runtime's bound) already: then it is rejected.
    """
    if not isinstance(goal, str) or not goal.strip():
        raise ValueError("goal must be a non-empty string")
    if not callable(runner):
        raise TypeError("runner must be a zero-argument callable returning a dict")
    delegation_id = _new_id()
    request = _base_request(
        delegation_id,
        context=context,
        toolsets=toolsets,
        role=role,
        model=model,
        session_key=session_key,
        origin_session_id=origin_session_id,
        origin_ui_session_id=origin_ui_session_id,
        parent_session_id=parent_session_id,
    )
    request["goal"] = goal
    unit = Unit(delegation_id, request, runner, interrupt_fn)
    return get_runtime().dispatch(
        unit,
        kind="delegation",
        goal=goal,
        cap=max_async_children,
        max_queued=max_queued_delegations,
    )


def dispatch_async_delegation_batch(
    *,
    goals: list[str],
    context: str | None = None,
    toolsets: list[str] | None = None,
    role: str | None = None,
    model: str | None = None,
    session_key: str | None = None,
    runner: Runner | None = None,
    runners: list[Runner] | None = None,
    interrupt_fn: Callable[[], None] | None = None,
    max_async_children: int = 3,
    origin_session_id: str | None = None,
    origin_ui_session_id: str | None = None,
    parent_session_id: str | None = None,
    max_queued_delegations: int | None = None,
) -> DispatchOutcome:
    """Start several goals as ONE unit holding one slot; one completion with ``results[]``.

    Give either ``runner`` (returns ``{"results": [...]}``) or ``runners``, one per goal,
    run in order inside the slot.
    """
    if (
        not isinstance(goals, list)
        or not goals
        or not all(isinstance(g, str) and g.strip() for g in goals)
    ):
        raise ValueError("goals must be a non-empty list of non-empty strings")
    if (runner is None) == (runners is None):
        raise TypeError("give exactly one of runner or runners")
    if runners is not None and len(runners) != len(goals):
        raise ValueError("runners must have one callable per goal")
    delegation_id = _new_id()
    request = _base_request(
        delegation_id,
        context=context,
        toolsets=toolsets,
        role=role,
        model=model,
        session_key=session_key,
        origin_session_id=origin_session_id,
        origin_ui_session_id=origin_ui_session_id,
        parent_session_id=parent_session_id,
    )
    request.update(goals=goals, is_batch=True)

    def run_batch() -> RunnerResult:
        if runner is not None:
            return runner()
        results = []
        for index, task in enumerate(runners or []):
            started = time.time()
            try:
                out = task()
            except Exception as exc:
                out = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
            results.append(
                {
                    "task_index": index,
                    "goal": goals[index],
                    "duration_seconds": round(time.time() - started, 3),
                    **out,
                }
            )
        return {"results": results}

    unit = Unit(delegation_id, request, run_batch, interrupt_fn)
    summary = f"batch of {len(goals)}: {goals[0]}"
    return get_runtime().dispatch(
        unit,
        kind="delegation",
        goal=summary,
        cap=max_async_children,
        max_queued=max_queued_delegations,
    )


def interrupt_delegation(delegation_id: str) -> bool:
    """Ask a running unit to stop (its runner's ``interrupt_fn``); a waiting one is cancelled."""
    return get_runtime().interrupt(delegation_id)


def cancel_delegation(delegation_id: str) -> bool:
    """Cancel: a waiting unit never starts; a running one is interrupted and ends cancelled."""
    return get_runtime().interrupt(delegation_id, cancel=True)


def list_delegations(
    *, session: str | None = None, state: str | None = None, limit: int = 100
) -> list[LedgerRow]:
    rows = get_runtime().ledger.query(
        RowQuery(kind="delegation", session=session, state=state, limit=limit)
    )
    return [row.as_dict() for row in rows]


# -- the delivery contract ---------------------------------------------------------------------


def _delivery_id(evt: object) -> str | None:
    """The ledger id an event is claimed under, or None for types that need no claim."""
    return delivery_id(evt)


def claim_event_delivery(evt: WireEvent, consumer: str) -> str | None:
    """A claim token; "" for event types that need none; None when held or settled."""
    row_id = _delivery_id(evt)
    if row_id is None:
        return ""
    return get_runtime().ledger.claim(row_id, consumer)


NOT_HOLDER = ""
"""What ``release_event_delivery`` returns when the claim is no longer the holder's: falsy."""


def complete_event_delivery(evt: WireEvent, claim: str | None) -> bool:
    """Acknowledge: the hand-off was accepted. Only the claim's holder can.

    True when the row is delivered under ``claim`` (a repeated ack is True too); False,
    logged and with the row untouched, when ``claim`` is no longer the holder's (its lease
    lapsed and another consumer claimed the row, or it was re-offered). Raises for
    programming errors: no claim token, a malformed event, an unknown id.
    """
    row_id = _delivery_id(evt)
    if row_id is None:
        return True
    if not claim:
        raise ValueError("complete_event_delivery needs the claim token claim_event_delivery gave")
    try:
        return get_runtime().ledger.complete(row_id, claim)
    except ClaimMismatchError as error:
        log.warning("complete_event_delivery: %s; the ack is lost", error)
        return False


def release_event_delivery(evt: WireEvent, claim: str | None, *, retryable: bool = False) -> str:
    """Give the claim back; ``retryable=True`` refunds the attempt (transient refusal).

    Returns the row's delivery state afterwards (``"pending"``, or ``"dropped"`` at the
    budget, or ``"delivered"`` when it had been acknowledged under ``claim``; ``"pending"``
    for event types that need no claim), or ``NOT_HOLDER`` (``""``, falsy), logged and with
    the row untouched, when ``claim`` is no longer the holder's. Raises for programming
    errors: no claim token, a malformed event, an unknown id.
    """
    row_id = _delivery_id(evt)
    if row_id is None:
        return "pending"
    if not claim:
        raise ValueError("release_event_delivery needs the claim token claim_event_delivery gave")
    try:
        return get_runtime().ledger.release(row_id, claim, retryable=retryable)
    except ClaimMismatchError as error:
        # Lost to a lapsed lease, a take-over or a re-offer: often a ``finally``.
        log.info("release_event_delivery: %s; the row is unchanged", error)
        return NOT_HOLDER


def drop_event_delivery(evt: WireEvent, claim: str | None, reason: str) -> bool:
    """The target is gone for good (session deleted, user reset): dropped, never delivered.

    False, logged and with the row untouched, when ``claim`` is no longer the holder's
    (like a lost complete or release: a consumer dropping in a ``finally`` never crashes).
    """
    row_id = _delivery_id(evt)
    if row_id is None:
        return False
    try:
        return get_runtime().ledger.drop(row_id, reason, token=claim or None)
    except ClaimMismatchError as error:
        log.info("drop_event_delivery: %s; the row is left as it is", error)
        return False


# What a dispatch knew before the work ran (the request, the routing): in the event, but
# not part of the runner's result.
_REQUEST_KEYS = frozenset(
    {
        "type",
        "delegation_id",
        "delivery_id",
        "session_key",
        "origin_session_id",
        "origin_ui_session_id",
        "parent_session_id",
        "goal",
        "goals",
        "context",
        "toolsets",
        "role",
        "model",
        "is_batch",
        "dispatched_at",
        "completed_at",
        "traceparent",
    }
)


def _result_of(event: JSONValue) -> JSONObject | None:
    """The runner's result as hermes stores it (``status``, ``summary``/``error`` or
    ``results``, the runner's own fields, durations): the event less the request."""
    if not isinstance(event, dict):
        return None
    return {k: v for k, v in event.items() if k not in _REQUEST_KEYS and not k.startswith("_")}


def get_durable_delegation(delegation_id: str) -> LedgerRow | None:
    """The row as a dict (every ledger column: ``delivery_state``, ``delivery_attempts``,
    ``event`` ...), or None.

    Also the keys hermes-agent's ``get_durable_delegation`` answers, which its consumers
    read: ``delegation_id``; ``origin_session``, the routing key (``session_key``; "" when
    none, like hermes' NOT NULL column); ``origin_session_id`` (the raw API session id, a
    column already); ``dispatched_at``; ``completed_at``; and ``result``, the runner's
    result as a dict (``status``, ``summary`` or ``error``, ``results`` for a batch), None
    until the work finished.

    A row retention pruned answers from its tombstone: how it had ended (``state``,
    ``delivery_state``), ``pruned_at``, and ``pruned``, the sentence "pruned on <date>
    (<why>)"; its ``result`` is gone (None). None only for an id never written (or whose
    tombstone expired too).
    """
    ledger = get_runtime().ledger
    row = ledger.get(delegation_id)
    if row is None:
        tomb = ledger.pruned(delegation_id)
        if tomb is None:
            return None
        return {
            "id": tomb.id,
            "delegation_id": tomb.id,
            "kind": tomb.kind,
            "state": tomb.state,
            "delivery_state": tomb.delivery_state,
            "session_key": tomb.session_key,
            "origin_session": tomb.session_key or "",
            "completed_at": tomb.completed_at,
            "settled_at": tomb.settled_at,
            "pruned_at": tomb.pruned_at,
            "pruned": tomb.describe(),
            "result": None,
        }
    event = row.event if isinstance(row.event, dict) else None
    known = event or row.request or {}
    dispatched = known.get("dispatched_at")
    return {
        **row.as_dict(),
        "delegation_id": row.id,
        "origin_session": row.session_key or "",
        "dispatched_at": dispatched if isinstance(dispatched, int | float) else row.created_at,
        "result": _result_of(event),
    }


def restore_undelivered_completions(completion_queue: EventQueue) -> int:
    """After a restart: re-offer every pending completion (oldest first) on the queue."""
    events: list[WireEvent] = get_runtime().ledger.restore()
    for event in events:
        completion_queue.put(event)
    return len(events)


# -- the same contract for asyncio consumers: no thread hop, the writer's future is awaited --


async def aclaim_event_delivery(evt: WireEvent, consumer: str) -> str | None:
    row_id = _delivery_id(evt)
    if row_id is None:
        return ""
    return await get_runtime().ledger.aclaim(row_id, consumer)


async def acomplete_event_delivery(evt: WireEvent, claim: str | None) -> bool:
    """``complete_event_delivery`` for asyncio consumers: the same returns and raises."""
    row_id = _delivery_id(evt)
    if row_id is None:
        return True
    if not claim:
        raise ValueError("complete_event_delivery needs the claim token claim_event_delivery gave")
    try:
        return await get_runtime().ledger.acomplete(row_id, claim)
    except ClaimMismatchError as error:
        log.warning("acomplete_event_delivery: %s; the ack is lost", error)
        return False


async def arelease_event_delivery(
    evt: WireEvent, claim: str | None, *, retryable: bool = False
) -> str:
    """``release_event_delivery`` for asyncio consumers: the same returns (``NOT_HOLDER``,
    falsy, for a claim that is no longer the holder's) and raises."""
    row_id = _delivery_id(evt)
    if row_id is None:
        return "pending"
    if not claim:
        raise ValueError("release_event_delivery needs the claim token claim_event_delivery gave")
    try:
        return await get_runtime().ledger.arelease(row_id, claim, retryable=retryable)
    except ClaimMismatchError as error:
        # Lost to a lapsed lease, a take-over or a re-offer: often a ``finally``.
        log.info("arelease_event_delivery: %s; the row is unchanged", error)
        return NOT_HOLDER
