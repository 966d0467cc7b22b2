"""The base of the completion events: the fields every completion has, and how they are read.

``CompletionEvent`` (the common fields, ``to_dict``/``wire`` back to the wire dict),
``DelegationResult`` (one item of a batch), the ledger's marks in an event dict, and the
small readers every kind's parser shares (``common_fields`` ...). The kinds themselves and
``parse_event`` live in ``delivery.events`` (work: delegations, processes) and
``delivery.timer_events`` (timers, watches, schedules, inbound events); import from
``delivery.events``, which re-exports all of them.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypedDict

from delivery.json_types import JSONObject

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


class MalformedEvent(ValueError):
    """The value is not a completion event at all (not a mapping)."""


def present(value: Any) -> bool:
    return value is not None and value != "" and value != [] and value != {}


def first(raw: Mapping[str, Any], keys: Iterable[str]) -> Any:
    for key in keys:
        value = raw.get(key)
        if present(value):
            return value
    return None


def opt_str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def is_success(status: Any) -> bool:
    return isinstance(status, str) and status.strip().lower() in SUCCESS_STATUSES


def shallow(raw: Mapping[Any, Any]) -> JSONObject:
    return {k if isinstance(k, str) else str(k): v for k, v in raw.items()}


# -- the base dataclass ---------------------------------------------------------------------


# The parser of every kind (``delivery.events.parse_event``), registered by that module when
# it is imported: it knows the kinds defined above this module, which must not import it.
_parser: Callable[[Mapping[str, Any]], CompletionEvent] | None = None


def use_parser(parser: Callable[[Mapping[str, Any]], CompletionEvent]) -> None:
    """Install the parser ``to_dict`` compares a parsed event's fields against."""
    global _parser
    _parser = parser


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
        if self.raw and _parser is not None:
            base = _parser(self.raw)
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
        return is_success(self.status)

    @property
    def key(self) -> str:
        """The id a consumer knows it by (``delivery_id(self, strict=False)``; "" when it
        has none): a batch's dedupe key, the label of its log lines."""
        raw = self.wire
        value = raw.get("delegation_id") or raw.get("delivery_id") or raw.get("process_id")
        return value if isinstance(value, str) and value else ""

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
        return is_success(self.status)

    def to_dict(self) -> Any:
        if isinstance(self.raw, Mapping):
            return dict(self.raw)
        if self.raw is not None:
            return self.raw
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "raw" and v is not None}


def is_restored(raw: Mapping[str, Any]) -> bool:
    """True when the ledger marked ``raw`` as offered again: ``restored`` exactly True (the
    key hermes' consumers read), or the older ``_restored`` mark. Any other ``restored``
    value (``1``, ``"yes"``, a count) is the event's own data, not the mark."""
    return raw.get("restored") is True or bool(raw.get("_restored"))


def is_ledger_mark(key: object, value: object) -> bool:
    """True for the ledger's bookkeeping in an event dict, not the event's data: every
    ``_``-prefixed key, and ``restored`` when it is exactly True (the re-offer mark)."""
    return str(key).startswith("_") or (key == "restored" and value is True)


class CommonFields(TypedDict):
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


def common_fields(raw: Mapping[str, Any]) -> CommonFields:
    kind = raw.get("type")
    status = raw.get("status")
    return {
        "type": kind if isinstance(kind, str) else None,
        "status": status if isinstance(status, str) and status else None,
        "session_key": opt_str(raw.get("session_key")),
        "origin_session_id": opt_str(raw.get("origin_session_id")),
        "origin_ui_session_id": opt_str(raw.get("origin_ui_session_id")),
        "dispatched_at": raw.get("dispatched_at"),
        "completed_at": raw.get("completed_at"),
        "error": raw.get("error") if present(raw.get("error")) else None,
        "restored": is_restored(raw),
        "raw": raw,
    }
