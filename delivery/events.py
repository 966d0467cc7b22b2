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

import copy
import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypedDict

from delivery.json_types import JSONObject

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

# -- the ``type`` literals: defined here once -------------------------------------------------

ASYNC_DELEGATION: Final = "async_delegation"
"""A delegation (single or batch) finished; claimed under its ``delegation_id``."""
PROCESS_COMPLETION: Final = "completion"
"""A background process exited; claimed under its ``delivery_id`` (= ``process_id``)."""
SCHEDULED_WAKEUP: Final = "scheduled_wakeup"
"""A wake-up the agent set came due; claimed under its ``delivery_id`` (the timer's row)."""
TIMER_KIND: Final = "timer"
"""The ledger ``kind`` of a wake-up's row."""
WATCH_KIND: Final = "watch"
"""The ledger ``kind`` of a watch's own row (running while it watches; its end, an expiry or
its process exiting unmatched, is that row's completion, a ``SCHEDULED_WAKEUP`` event)."""
WATCH_FIRE_KIND: Final = "watch_fire"
"""The ledger ``kind`` of one firing of a watch (a ``SCHEDULED_WAKEUP`` event, due at once)."""
INBOUND_EVENT: Final = "inbound_event"
"""An inbound event came, or a wait for one expired; claimed under its ``delivery_id``."""
INBOUND_KIND: Final = "inbound"
"""The ledger ``kind`` of an inbound event routed to a configured conversation."""
WAIT_KIND: Final = "wake_when"
"""The ledger ``kind`` of a ``wake_when`` wait: due at its expiry, brought forward by a match."""
EVENT_TYPES: Final = frozenset(
    {ASYNC_DELEGATION, PROCESS_COMPLETION, SCHEDULED_WAKEUP, INBOUND_EVENT}
)
"""The types the ledger writes; anything else (``watch_match`` ...) parses as generic."""
DELIVERABLE_TYPES: Final = EVENT_TYPES | frozenset({"watch_match", "watch_disabled"})
"""The types a wake-up is made of: the ledger's and a process watch's (SPEC.md's
``watch_match`` and friends). Any other type, or none, is refused at the router's edge."""

EventKind = Literal[
    "delegation",
    "delegation_batch",
    "process",
    "scheduled_wakeup",
    "inbound_event",
    "abandoned",
    "generic",
]

SUCCESS_STATUSES: Final = frozenset({"completed", "success", "succeeded", "ok", "done"})

# Legacy spellings, first one wins; the first name is the canonical one.
_EXIT_CODE_KEYS = ("exit_code", "returncode", "return_code")
_OUTPUT_KEYS = ("output_tail", "output", "tail", "stdout")
_COMMAND_KEYS = ("command", "cmd")
_PROCESS_ID_KEYS = ("process_id", "proc_id", "session_id", "pid")
_DURATION_KEYS = ("duration_seconds", "duration")


class MalformedEvent(ValueError):
    """The value is not a completion event at all (not a mapping)."""


def _present(value: Any) -> bool:
    return value is not None and value != "" and value != [] and value != {}


def _first(raw: Mapping[str, Any], keys: Iterable[str]) -> Any:
    for key in keys:
        value = raw.get(key)
        if _present(value):
            return value
    return None


def _opt_str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _is_success(status: Any) -> bool:
    return isinstance(status, str) and status.strip().lower() in SUCCESS_STATUSES


def _shallow(raw: Mapping[Any, Any]) -> JSONObject:
    return {k if isinstance(k, str) else str(k): v for k, v in raw.items()}


# -- the dataclasses ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CompletionEvent:
    """What every completion has. ``raw`` is the wire dict it was parsed from."""

    type: str | None = None
    status: str | None = None
    session_key: str | None = None
    origin_session_id: str | None = None
    origin_ui_session_id: str | None = None
    dispatched_at: Any = None
    completed_at: Any = None
    error: Any = None
    restored: bool = False
    """The ledger offered it again (restart, orphan re-offer): on the wire ``restored: True``
    (the key hermes' consumers read) and the older ``_restored: True``; see ``is_restored``."""
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)

    kind: EventKind = field(default="generic", init=False)

    def to_dict(self) -> JSONObject:
        """The wire dict: ``raw`` unchanged, plus any field changed since parsing (under its
        canonical key)."""
        try:
            out = copy.deepcopy(dict(self.raw))
        except RecursionError:
            out = dict(self.raw)
        if self.raw:
            base = parse_event(self.raw)
            if type(base) is type(self) and base == self:
                return out
        else:
            base = None
        for f in dataclasses.fields(self):
            if f.name in ("raw", "kind") or not f.init:
                continue
            value = getattr(self, f.name)
            if base is not None and getattr(base, f.name, None) == value:
                continue
            _put(out, f.name, value)
        return out

    @property
    def succeeded(self) -> bool:
        return _is_success(self.status)

    @property
    def key(self) -> str:
        """The id a consumer knows it by (``delivery_id(self, strict=False)``; "" when it
        has none): a batch's dedupe key, the label of its log lines."""
        return delivery_id(self, strict=False) or ""

    @property
    def wire(self) -> dict[str, Any]:
        """The wire dict the delivery contract (``tools.async_delegation``) is called with:
        a shallow copy of ``raw``, or ``to_dict()`` for an event built in code."""
        return dict(self.raw) if self.raw else self.to_dict()


def _put(out: JSONObject, name: str, value: Any) -> None:
    if name == "restored":
        if value:
            out["restored"] = out["_restored"] = True
        else:
            out.pop("_restored", None)
            if out.get("restored") is True:
                del out["restored"]
    elif name == "results":
        out["results"] = [r.to_dict() if isinstance(r, DelegationResult) else r for r in value]
    elif name == "work":
        out.update(value.to_dict())
        out["abandoned"] = True
    elif isinstance(value, tuple):
        if value or name in out:
            out[name] = list(value)
    elif value is not None or name in out:
        out[name] = value


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
class DelegationResult:
    """One item of a batch. ``raw`` is the item as it came (it may not even be a dict)."""

    goal: Any = None
    status: str | None = None
    summary: Any = None
    error: Any = None
    result: Any = None
    duration_seconds: Any = None
    raw: Any = field(default=None, repr=False)

    @property
    def succeeded(self) -> bool:
        return _is_success(self.status)

    def to_dict(self) -> Any:
        if isinstance(self.raw, Mapping):
            return dict(self.raw)
        if self.raw is not None:
            return self.raw
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "raw" and v is not None}


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
        if _present(own):
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


@dataclass(frozen=True)
class ScheduledWakeupEvent(CompletionEvent):
    """A wake-up the agent set for itself came due (``type == SCHEDULED_WAKEUP``): written
    with the timer's row when it was set, deliverable from ``due_at`` on."""

    delivery_id: str | None = None
    note: str | None = None
    due_at: float | None = None
    """The instant it was set for (epoch seconds); ``zone`` names the zone it was given in."""
    zone: str | None = None
    watch_id: str | None = None
    """Set when a watch woke the conversation (``tools.watch_tool``): which one."""
    watch_event: str | None = None
    """``fired``, ``expired`` (its lifetime ran out) or ``ended`` (its process exited)."""
    matched: str | None = None
    """What made it fire: the output line that matched, or the command that exited 0."""
    fires: int | None = None
    """How many times the watch has fired, this firing included."""
    schedule_id: str | None = None
    """Set for an occurrence of a recurring schedule (``delivery.schedules_engine``), with
    ``schedule`` (its spec, for people) and ``missed``: how many occurrences were missed
    with this one. ``status == "missed"``: this occurrence did not run (its misfire policy)."""
    schedule: str | None = None
    missed: int = 0

    kind: EventKind = field(default="scheduled_wakeup", init=False)


@dataclass(frozen=True)
class InboundWakeupEvent(ScheduledWakeupEvent):
    """An inbound event for this conversation (``type == INBOUND_EVENT``). ``outcome``:
    ``"event"`` (the hook routes its events here), ``"matched"`` (a ``wake_when`` wait's
    match held) or ``"expired"`` (the wait's lifetime ran out with no match: no ``payload``).
    ``payload`` is the event's body as it came (JSON text, untrusted: defanged wherever it
    is shown); ``note`` is what the agent wrote when it set the wait."""

    hook: str | None = None
    webhook_id: str | None = None
    received_at: float | None = None
    payload: str | None = None
    outcome: str | None = None
    match: str | None = None

    kind: EventKind = field(default="inbound_event", init=False)


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


def is_restored(raw: Mapping[str, Any]) -> bool:
    """True when the ledger marked ``raw`` as offered again: ``restored`` exactly True (the
    key hermes' consumers read), or the older ``_restored`` mark. Any other ``restored``
    value (``1``, ``"yes"``, a count) is the event's own data, not the mark."""
    return raw.get("restored") is True or bool(raw.get("_restored"))


def is_ledger_mark(key: object, value: object) -> bool:
    """True for the ledger's bookkeeping in an event dict, not the event's data: every
    ``_``-prefixed key, and ``restored`` when it is exactly True (the re-offer mark)."""
    return str(key).startswith("_") or (key == "restored" and value is True)


# -- parsing -----------------------------------------------------------------------------------


class _CommonFields(TypedDict):
    """The keyword arguments of ``CompletionEvent`` that every parser fills."""

    type: str | None
    status: str | None
    session_key: str | None
    origin_session_id: str | None
    origin_ui_session_id: str | None
    dispatched_at: Any
    completed_at: Any
    error: Any
    restored: bool
    raw: Mapping[str, Any]


class _DelegationCommonFields(_CommonFields):
    """``_CommonFields`` and those of ``_DelegationFields``."""

    delegation_id: str | None
    context: Any
    toolsets: tuple[str, ...]
    role: Any
    model: Any
    parent_session_id: str | None


def _common(raw: Mapping[str, Any]) -> _CommonFields:
    kind = raw.get("type")
    status = raw.get("status")
    return {
        "type": kind if isinstance(kind, str) else None,
        "status": status if isinstance(status, str) and status else None,
        "session_key": _opt_str(raw.get("session_key")),
        "origin_session_id": _opt_str(raw.get("origin_session_id")),
        "origin_ui_session_id": _opt_str(raw.get("origin_ui_session_id")),
        "dispatched_at": raw.get("dispatched_at"),
        "completed_at": raw.get("completed_at"),
        "error": raw.get("error") if _present(raw.get("error")) else None,
        "restored": is_restored(raw),
        "raw": raw,
    }


def _toolsets(value: Any) -> tuple[str, ...]:
    if isinstance(value, list | tuple):
        return tuple(str(t) for t in value)
    if isinstance(value, str) and value:
        return (value,)
    return ()


def _delegation_common(raw: Mapping[str, Any]) -> _DelegationCommonFields:
    return {
        **_common(raw),
        "delegation_id": _opt_str(raw.get("delegation_id")),
        "context": raw.get("context"),
        "toolsets": _toolsets(raw.get("toolsets")),
        "role": raw.get("role"),
        "model": raw.get("model"),
        "parent_session_id": _opt_str(raw.get("parent_session_id")),
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
            **_delegation_common(raw),
            goals=tuple(str(g) for g in goals) if isinstance(goals, list | tuple) else (),
            results=tuple(_result_item(r) for r in results) if isinstance(results, list) else (),
            summary=raw.get("summary"),
            result=raw.get("result"),
            total_duration_seconds=total if total is not None else raw.get("duration_seconds"),
        )
    goal = raw.get("goal")
    if not _present(goal):
        goals = raw.get("goals")
        if isinstance(goals, list | tuple) and goals:
            goal = str(goals[0])
    return DelegationEvent(
        **_delegation_common(raw),
        goal=goal if _present(goal) else None,
        summary=raw.get("summary"),
        result=raw.get("result"),
        duration_seconds=raw.get("duration_seconds"),
    )


def _process(raw: Mapping[str, Any]) -> ProcessCompletionEvent:
    return ProcessCompletionEvent(
        **_common(raw),
        delivery_id=_opt_str(raw.get("delivery_id")),
        process_id=_first(raw, _PROCESS_ID_KEYS),
        command=_first(raw, _COMMAND_KEYS),
        cwd=raw.get("cwd") if _present(raw.get("cwd")) else None,
        exit_code=_first(raw, _EXIT_CODE_KEYS),
        output_tail=_first(raw, _OUTPUT_KEYS),
        output_bytes=raw.get("output_bytes"),
        duration_seconds=_first(raw, _DURATION_KEYS),
        started_at=raw.get("started_at"),
    )


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _scheduled_wakeup(raw: Mapping[str, Any]) -> ScheduledWakeupEvent:
    return ScheduledWakeupEvent(
        **_common(raw),
        delivery_id=_opt_str(raw.get("delivery_id")),
        note=_opt_str(raw.get("note")),
        due_at=_number(raw.get("due_at")),
        zone=_opt_str(raw.get("zone")),
        watch_id=_opt_str(raw.get("watch_id")),
        watch_event=_opt_str(raw.get("watch_event")),
        matched=_opt_str(raw.get("matched")),
        fires=int(fires) if (fires := _number(raw.get("fires"))) is not None else None,
        schedule_id=_opt_str(raw.get("schedule_id")),
        schedule=_opt_str(raw.get("schedule")),
        missed=int(_number(raw.get("missed")) or 0),
    )


def _inbound(raw: Mapping[str, Any]) -> InboundWakeupEvent:
    payload = raw.get("payload")
    return InboundWakeupEvent(
        **_common(raw),
        delivery_id=_opt_str(raw.get("delivery_id")),
        note=_opt_str(raw.get("note")),
        due_at=_number(raw.get("due_at")),
        zone=_opt_str(raw.get("zone")),
        hook=_opt_str(raw.get("hook")),
        webhook_id=_opt_str(raw.get("webhook_id")),
        received_at=_number(raw.get("received_at")),
        payload=payload if isinstance(payload, str) else None,
        outcome=_opt_str(raw.get("outcome")),
        match=_opt_str(raw.get("match")),
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
    wire = raw if all(isinstance(k, str) for k in raw) else _shallow(raw)
    kind = wire.get("type")
    work: WorkEvent | None
    if kind == ASYNC_DELEGATION:
        work = _delegation(wire)
    elif kind == PROCESS_COMPLETION:
        work = _process(wire)
    elif kind == SCHEDULED_WAKEUP:
        return _scheduled_wakeup(wire)
    elif kind == INBOUND_EVENT:
        return _inbound(wire)
    else:
        return GenericEvent(**_common(wire))
    if wire.get("abandoned"):
        return AbandonedWork(**_common(wire), work=work)
    return work


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
