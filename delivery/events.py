"""The completion events, typed: one vocabulary for what finished background work reports.

On the wire (the completion queue, the ledger's ``event`` column) a completion stays the
plain dict SPEC.md "Completion events" describes; producers keep writing those dicts. Readers
call ``parse_event`` once, at the edge, and get a frozen dataclass whose fields have one
spelling each (``exit_code``, not ``returncode``/``return_code``; ``output_tail``, not
``output``/``tail``/``stdout``). ``event.to_dict()`` gives the wire dict back unchanged.

Kinds (``event.kind``) and the dataclass for each:

* ``"delegation"`` — ``DelegationEvent``: one delegated goal finished;
* ``"delegation_batch"`` — ``DelegationBatchEvent``: several goals as one unit, with a
  ``DelegationResult`` per item;
* ``"process"`` — ``ProcessCompletionEvent``: a background shell process exited;
* ``"scheduled_wakeup"`` — ``ScheduledWakeupEvent``: a wake-up the agent set for itself
  (``schedule_wakeup``) came due, or a watch it set fired or ended (``watch_id``,
  ``watch_event``, ``matched``); ``note`` is what it wrote for its later self;
* ``"inbound_event"`` — ``InboundWakeupEvent``: an inbound event (``POST /v1/hooks/{name}``)
  came for this conversation, either routed to it by the hook's settings or matching a
  ``wake_when`` wait; or the wait's lifetime ran out (``outcome == "expired"``). It is a
  ``ScheduledWakeupEvent`` too (delivered the same way, due at a time);
* ``"abandoned"`` — ``AbandonedWork``: work whose owner process died before it finished
  (``delivery.recovery.abandoned_event``: state ``interrupted`` when it never started,
  ``unknown`` when it was running); ``.work`` is the delegation or process event it stands for;
* ``"generic"`` — ``GenericEvent``: any other ``type`` (``watch_match`` ...) or none, with
  the raw dict kept.

``delivery_id(evt)`` is the ledger id a completion is claimed under;
``delivery.event_display.display_metadata(evt)`` is the small JSON-safe summary stored
beside a wake text (and carried in it, see ``agent.markers.WAKE_DATA_MARKER``) so that front
ends and the demo model read fields instead of prose.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from delivery.event_base import (
    SUCCESS_STATUSES,
    CommonFields,
    CompletionEvent,
    DelegationResult,
    EventKind,
    MalformedEvent,
    common_fields,
    first,
    is_ledger_mark,
    is_restored,
    opt_str,
    present,
    shallow,
    use_parser,
)
from delivery.timer_events import (
    INBOUND_EVENT,
    INBOUND_KIND,
    SCHEDULED_WAKEUP,
    TIMER_KIND,
    WAIT_KIND,
    WATCH_FIRE_KIND,
    WATCH_KIND,
    InboundWakeupEvent,
    ScheduledWakeupEvent,
    parse_inbound,
    parse_scheduled_wakeup,
)

__all__ = [
    "ASYNC_DELEGATION",
    "DELIVERABLE_TYPES",
    "EVENT_TYPES",
    "INBOUND_EVENT",
    "INBOUND_KIND",
    "PROCESS_COMPLETION",
    "SCHEDULED_WAKEUP",
    "SUCCESS_STATUSES",
    "TIMER_KIND",
    "TRANSCRIPT_KEY_PREFIX",
    "WAIT_KIND",
    "WATCH_FIRE_KIND",
    "WATCH_KIND",
    "AbandonedWork",
    "CompletionEvent",
    "DelegationBatchEvent",
    "DelegationEvent",
    "DelegationResult",
    "EventKind",
    "GenericEvent",
    "InboundWakeupEvent",
    "MalformedEvent",
    "ProcessCompletionEvent",
    "ScheduledWakeupEvent",
    "delegation_counts",
    "delivery_id",
    "is_ledger_mark",
    "is_restored",
    "parse_event",
    "transcript_key",
]

# -- the ``type`` literals of work (the timer family's: delivery.timer_events) -----------------

ASYNC_DELEGATION: Final = "async_delegation"
"""A delegation (single or batch) finished; claimed under its ``delegation_id``."""
PROCESS_COMPLETION: Final = "completion"
"""A background process exited; claimed under its ``delivery_id`` (= ``process_id``)."""
EVENT_TYPES: Final = frozenset(
    {ASYNC_DELEGATION, PROCESS_COMPLETION, SCHEDULED_WAKEUP, INBOUND_EVENT}
)
"""The types the ledger writes; anything else (``watch_match`` ...) parses as generic."""
DELIVERABLE_TYPES: Final = EVENT_TYPES | frozenset({"watch_match", "watch_disabled"})
"""The types a wake-up is made of: the ledger's and a process watch's (SPEC.md's
``watch_match`` and friends). Any other type, or none, is refused at the router's edge."""

# Legacy spellings, first one wins; the first name is the canonical one.
_EXIT_CODE_KEYS = ("exit_code", "returncode", "return_code")
_OUTPUT_KEYS = ("output_tail", "output", "tail", "stdout")
_COMMAND_KEYS = ("command", "cmd")
_PROCESS_ID_KEYS = ("process_id", "proc_id", "session_id", "pid")
_DURATION_KEYS = ("duration_seconds", "duration")


# -- the dataclasses ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _DelegationFields(CompletionEvent):
    delegation_id: str | None = None
    context: Any = None
    toolsets: tuple[str, ...] = ()
    role: Any = None
    model: Any = None
    parent_session_id: str | None = None


@dataclass(frozen=True)
class DelegationEvent(_DelegationFields):
    """One delegated goal finished (``type == ASYNC_DELEGATION``, not a batch)."""

    goal: Any = None
    summary: Any = None
    result: Any = None
    """A runner's extra ``result`` field, shown when there is neither summary nor error."""
    duration_seconds: Any = None

    kind: EventKind = field(default="delegation", init=False)


@dataclass(frozen=True)
class DelegationBatchEvent(_DelegationFields):
    """Several goals dispatched as one unit; one result per item."""

    goals: tuple[str, ...] = ()
    results: tuple[DelegationResult, ...] = ()
    summary: Any = None
    result: Any = None
    total_duration_seconds: Any = None

    kind: EventKind = field(default="delegation_batch", init=False)

    def goal_of(self, index: int) -> Any:
        """An item's own goal, else the batch's goal at that position."""
        own = self.results[index].goal if index < len(self.results) else None
        if present(own):
            return own
        return self.goals[index] if index < len(self.goals) else None


@dataclass(frozen=True)
class ProcessCompletionEvent(CompletionEvent):
    """A background process exited (``type == PROCESS_COMPLETION``)."""

    delivery_id: str | None = None
    process_id: Any = None
    command: Any = None
    cwd: Any = None
    exit_code: Any = None
    output_tail: Any = None
    output_bytes: Any = None
    duration_seconds: Any = None
    started_at: Any = None

    kind: EventKind = field(default="process", init=False)


WorkEvent = DelegationEvent | DelegationBatchEvent | ProcessCompletionEvent


@dataclass(frozen=True)
class AbandonedWork(CompletionEvent):
    """Work whose owner process died before it finished: ``interrupted`` (it never started)
    or ``unknown`` (it was running; it may have had effects). ``work`` is the same event read
    as its own kind, so it renders like any other delegation or process completion."""

    work: WorkEvent | None = None

    kind: EventKind = field(default="abandoned", init=False)

    @property
    def never_started(self) -> bool:
        return self.status == "interrupted"


@dataclass(frozen=True)
class GenericEvent(CompletionEvent):
    """Any other type (``watch_match`` ...), or none: only the raw dict is known."""

    kind: EventKind = field(default="generic", init=False)


# -- parsing -----------------------------------------------------------------------------------


class _DelegationCommonFields(CommonFields):
    """``CommonFields`` and those of ``_DelegationFields``."""

    delegation_id: str | None
    context: Any
    toolsets: tuple[str, ...]
    role: Any
    model: Any
    parent_session_id: str | None


def _toolsets(value: Any) -> tuple[str, ...]:
    if isinstance(value, list | tuple):
        return tuple(str(t) for t in value)
    if isinstance(value, str) and value:
        return (value,)
    return ()


def _delegationcommon_fields(raw: Mapping[str, Any]) -> _DelegationCommonFields:
    return {
        **common_fields(raw),
        "delegation_id": opt_str(raw.get("delegation_id")),
        "context": raw.get("context"),
        "toolsets": _toolsets(raw.get("toolsets")),
        "role": raw.get("role"),
        "model": raw.get("model"),
        "parent_session_id": opt_str(raw.get("parent_session_id")),
    }


def _result_item(item: Any) -> DelegationResult:
    if not isinstance(item, Mapping):
        return DelegationResult(raw=item)
    status = item.get("status")
    return DelegationResult(
        goal=item.get("goal"),
        status=status if isinstance(status, str) and status else None,
        summary=item.get("summary"),
        error=item.get("error"),
        result=item.get("result"),
        duration_seconds=item.get("duration_seconds"),
        raw=item,
    )


def _is_batch(raw: Mapping[str, Any]) -> bool:
    return bool(raw.get("is_batch")) or isinstance(raw.get("results"), list)


def _delegation(raw: Mapping[str, Any]) -> DelegationEvent | DelegationBatchEvent:
    if _is_batch(raw):
        results = raw.get("results")
        goals = raw.get("goals")
        total = raw.get("total_duration_seconds")
        return DelegationBatchEvent(
            **_delegationcommon_fields(raw),
            goals=tuple(str(g) for g in goals) if isinstance(goals, list | tuple) else (),
            results=tuple(_result_item(r) for r in results) if isinstance(results, list) else (),
            summary=raw.get("summary"),
            result=raw.get("result"),
            total_duration_seconds=total if total is not None else raw.get("duration_seconds"),
        )
    goal = raw.get("goal")
    if not present(goal):
        goals = raw.get("goals")
        if isinstance(goals, list | tuple) and goals:
            goal = str(goals[0])
    return DelegationEvent(
        **_delegationcommon_fields(raw),
        goal=goal if present(goal) else None,
        summary=raw.get("summary"),
        result=raw.get("result"),
        duration_seconds=raw.get("duration_seconds"),
    )


def _process(raw: Mapping[str, Any]) -> ProcessCompletionEvent:
    return ProcessCompletionEvent(
        **common_fields(raw),
        delivery_id=opt_str(raw.get("delivery_id")),
        process_id=first(raw, _PROCESS_ID_KEYS),
        command=first(raw, _COMMAND_KEYS),
        cwd=raw.get("cwd") if present(raw.get("cwd")) else None,
        exit_code=first(raw, _EXIT_CODE_KEYS),
        output_tail=first(raw, _OUTPUT_KEYS),
        output_bytes=raw.get("output_bytes"),
        duration_seconds=first(raw, _DURATION_KEYS),
        started_at=raw.get("started_at"),
    )


def parse_event(raw: Any) -> CompletionEvent:
    """The typed event of a wire dict; tolerant of every legacy spelling.

    A mapping never fails: an unknown or missing ``type`` gives a ``GenericEvent`` that
    keeps the dict. Anything else raises ``MalformedEvent`` (a ValueError) naming its type.
    An already typed event is returned as it is.
    """
    if isinstance(raw, CompletionEvent):
        return raw
    if not isinstance(raw, Mapping):
        raise MalformedEvent(f"a completion event must be a mapping, not {type(raw).__name__}")
    wire = raw if all(isinstance(k, str) for k in raw) else shallow(raw)
    kind = wire.get("type")
    work: WorkEvent | None
    if kind == ASYNC_DELEGATION:
        work = _delegation(wire)
    elif kind == PROCESS_COMPLETION:
        work = _process(wire)
    elif kind == SCHEDULED_WAKEUP:
        return parse_scheduled_wakeup(wire)
    elif kind == INBOUND_EVENT:
        return parse_inbound(wire)
    else:
        return GenericEvent(**common_fields(wire))
    if wire.get("abandoned"):
        return AbandonedWork(**common_fields(wire), work=work)
    return work


use_parser(parse_event)


# -- ids, counts, display ----------------------------------------------------------------------


def _wire(evt: Any) -> Mapping[str, Any]:
    if isinstance(evt, CompletionEvent):
        return evt.raw if evt.raw else evt.to_dict()
    if isinstance(evt, Mapping):
        return evt
    raise TypeError(f"a completion event must be a dict, not {type(evt).__name__}")


# The dedupe key of a delegation's result as a delivery row of an API session's transcript:
# the row's writer (gateway.wake) and retention, which keeps the ledger row of a result no
# turn has folded yet, name it alike.
TRANSCRIPT_KEY_PREFIX = "deleg:"


def transcript_key(delegation_id: str) -> str:
    return TRANSCRIPT_KEY_PREFIX + delegation_id


def delivery_id(evt: Any, *, strict: bool = True) -> str | None:
    """The ledger id an event is claimed under; None for types that need no claim.

    Strict (the delivery contract): a delegation is claimed under ``delegation_id`` (missing
    -> ValueError), any other type under ``delivery_id`` (missing -> None); a non-mapping or a
    non-string id raises TypeError. ``strict=False`` is the lenient label for logs and
    idempotency keys: the first string of ``delegation_id``, ``delivery_id``, ``process_id``,
    None when there is none or ``evt`` is not an event at all (it never raises).
    """
    if not strict:
        try:
            raw = _wire(evt)
        except TypeError:
            return None
        value = raw.get("delegation_id") or raw.get("delivery_id") or raw.get("process_id")
        return value if isinstance(value, str) and value else None
    if isinstance(evt, CompletionEvent):
        raw = _wire(evt)
    elif isinstance(evt, dict):
        raw = evt
    else:
        raise TypeError(f"a completion event must be a dict, not {type(evt).__name__}")
    if raw.get("type") == ASYNC_DELEGATION:
        row_id = raw.get("delegation_id")
        if row_id is None:
            raise ValueError("async_delegation event has no delegation_id")
    else:
        row_id = raw.get("delivery_id")
        if row_id is None:
            return None
    if not isinstance(row_id, str) or not row_id:
        raise TypeError("the event's delegation_id/delivery_id must be a non-empty string")
    return row_id


def delegation_counts(evt: Any) -> dict[str, int]:
    """``{"tasks", "completed", "failed"}`` for a delegation event (typed or wire dict).

    A single delegation is one task. For a batch, tasks come from ``results[]`` (or the
    goals when results are missing); anything that did not complete counts as failed.
    """
    event = evt if isinstance(evt, CompletionEvent) else None
    if event is None:
        raw = evt if isinstance(evt, Mapping) else {}
        # counts are asked of partial dicts too (no type): read them as a delegation
        event = _delegation(raw)
    if isinstance(event, AbandonedWork) and event.work is not None:
        event = event.work
    if isinstance(event, DelegationBatchEvent):
        tasks = len(event.results) or len(event.goals)
        completed = sum(1 for r in event.results if isinstance(r.raw, Mapping) and r.succeeded)
    else:
        tasks = 1
        completed = 1 if event.succeeded else 0
    return {"tasks": tasks, "completed": completed, "failed": tasks - completed}
