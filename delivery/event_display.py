"""The display summary of a completion: ``display_metadata(evt)``, a small JSON-safe dict of
what a person (or a front end, or the demo model) needs to show it — kind, goal(s), status,
result or error previews, duration, command, exit code, the last lines of output, ids.

Surfaces store it beside a wake-up text (delivery rows keep it in ``display_metadata``), so
nothing downstream parses prose back. Texts are short previews: the summary sits beside,
and inside, the full wake text. Whatever the event holds (lone surrogates, NaN, ints beyond
2**53, deep nesting), the result can be stored as UTF-8 JSON.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from delivery.events import (
    AbandonedWork,
    DelegationBatchEvent,
    DelegationEvent,
    InboundWakeupEvent,
    ProcessCompletionEvent,
    ScheduledWakeupEvent,
    delegation_counts,
    delivery_id,
    is_ledger_mark,
    parse_event,
)
from delivery.json_types import JSONObject

__all__ = ["display_metadata"]

_TEXT_PREVIEW_CHARS = 500
_ITEM_PREVIEW_CHARS = 300
_OUTPUT_PREVIEW_LINES = 10
_OUTPUT_PREVIEW_CHARS = 1000
_JSON_SAFE_INT = 2**53


def _safe_str(text: str) -> str:
    # Lone surrogates cannot be stored as UTF-8 (SQLite, JSON with ensure_ascii=False).
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _json_safe(value: Any, depth: int = 0) -> Any:
    """A JSON-safe copy: bounded depth, no NaN, ints beyond 2**53 as strings."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if abs(value) >= _JSON_SAFE_INT:
            return (
                f"<integer of {value.bit_length()} bits>"
                if value.bit_length() > 4000
                else str(value)
            )
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return _safe_str(value)
    if depth >= 8:
        return "<nested too deeply>"
    if isinstance(value, Mapping):
        return {_safe_str(str(k)): _json_safe(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v, depth + 1) for v in value]
    return _safe_str(repr(value)) if depth < 8 else "<value>"


def _text_preview(value: Any, limit: int) -> Any:
    if value is None:
        return None
    text = value if isinstance(value, str) else None
    if text is None:
        safe = _json_safe(value)
        if not isinstance(safe, str):
            return safe if len(repr(safe)) <= limit else "<structured value>"
        text = safe
    text = _safe_str(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _output_preview(value: Any) -> Any:
    if value is None:
        return None
    text = _safe_str(value if isinstance(value, str) else str(_json_safe(value)))
    lines = text.rstrip("\n").splitlines()[-_OUTPUT_PREVIEW_LINES:]
    tail = "\n".join(lines)
    return tail if len(tail) <= _OUTPUT_PREVIEW_CHARS else "…" + tail[-_OUTPUT_PREVIEW_CHARS:]


def _number(value: Any) -> Any:
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float):
        return _json_safe(value)
    return _text_preview(value, 64)


def _delegation_metadata(event: DelegationEvent | DelegationBatchEvent) -> JSONObject:
    counts = delegation_counts(event)
    status = event.status or ("completed" if counts["failed"] == 0 else "failed")
    meta: JSONObject = {
        "delegation_id": event.delegation_id,
        "status": status,
        **counts,
        "is_batch": isinstance(event, DelegationBatchEvent),
        "dispatched_at": _number(event.dispatched_at),
        "completed_at": _number(event.completed_at),
    }
    if isinstance(event, DelegationBatchEvent):
        meta["goals"] = [_text_preview(g, _ITEM_PREVIEW_CHARS) for g in event.goals]
        meta["duration_seconds"] = _number(event.total_duration_seconds)
        meta["results"] = [
            _pruned(
                {
                    "goal": _text_preview(event.goal_of(i), _ITEM_PREVIEW_CHARS),
                    "status": _text_preview(r.status, 64),
                    "summary": _text_preview(r.summary, _ITEM_PREVIEW_CHARS),
                    "error": _text_preview(r.error, _ITEM_PREVIEW_CHARS),
                    "result": _text_preview(
                        r.result if isinstance(r.raw, Mapping) else r.raw, _ITEM_PREVIEW_CHARS
                    ),
                    "duration_seconds": _number(r.duration_seconds),
                }
            )
            for i, r in enumerate(event.results)
        ]
    else:
        meta["goal"] = _text_preview(event.goal, _TEXT_PREVIEW_CHARS)
        meta["duration_seconds"] = _number(event.duration_seconds)
    meta["summary"] = _text_preview(event.summary, _TEXT_PREVIEW_CHARS)
    meta["error"] = _text_preview(event.error, _TEXT_PREVIEW_CHARS)
    meta["result"] = _text_preview(event.result, _TEXT_PREVIEW_CHARS)
    return meta


def _process_metadata(event: ProcessCompletionEvent) -> JSONObject:
    return {
        "delivery_id": event.delivery_id,
        "process_id": _text_preview(event.process_id, 128),
        "status": event.status,
        "command": _text_preview(event.command, _TEXT_PREVIEW_CHARS),
        "exit_code": _number(event.exit_code),
        "duration_seconds": _number(event.duration_seconds),
        "output_tail": _output_preview(event.output_tail),
        "error": _text_preview(event.error, _TEXT_PREVIEW_CHARS),
        "dispatched_at": _number(event.dispatched_at),
        "completed_at": _number(event.completed_at),
    }


def _wakeup_metadata(event: ScheduledWakeupEvent) -> JSONObject:
    inbound: JSONObject = {}
    if isinstance(event, InboundWakeupEvent):
        inbound = {
            "hook": _text_preview(event.hook, 128),
            "webhook_id": _text_preview(event.webhook_id, 128),
            "outcome": _text_preview(event.outcome, 32),
            "received_at": _number(event.received_at),
        }
    return {
        **inbound,
        "delivery_id": event.delivery_id,
        "status": event.status,
        "note": _text_preview(event.note, _TEXT_PREVIEW_CHARS),
        "due_at": _number(event.due_at),
        "zone": _text_preview(event.zone, 64),
        "dispatched_at": _number(event.dispatched_at),
        "completed_at": _number(event.completed_at),
    }


def _pruned(item: JSONObject) -> JSONObject:
    return {k: v for k, v in item.items() if v is not None}


_KEEP_WHEN_NONE = frozenset({"delegation_id", "goal", "dispatched_at", "completed_at"})


def display_metadata(evt: Any) -> JSONObject:
    """A small JSON-safe summary of a completion, stored beside its wake text.

    Keys: ``kind``, ``type``, the ids (``delegation_id`` | ``delivery_id``/``process_id`` |
    another event's ``delivery_id``),
    ``status``, ``goal`` or ``goals`` (+ ``results[]`` per item of a batch), the task counts
    of a delegation, ``summary``, ``error``, ``result``, ``duration_seconds``, ``command``,
    ``exit_code``, ``output_tail`` (its last lines), ``dispatched_at``, ``completed_at``, and
    ``restored``/``abandoned`` when set. Texts are previews (a few hundred characters): the
    wake text has them in full. Never raises for a mapping; raises ``MalformedEvent`` for
    anything else.
    """
    event = parse_event(evt)
    meta: JSONObject = {"kind": event.kind, "type": _text_preview(event.type, 64)}
    work = event.work if isinstance(event, AbandonedWork) else event
    if isinstance(work, DelegationEvent | DelegationBatchEvent):
        meta.update(_delegation_metadata(work))
    elif isinstance(work, ProcessCompletionEvent):
        meta.update(_process_metadata(work))
    elif isinstance(work, ScheduledWakeupEvent):
        meta.update(_wakeup_metadata(work))
    else:
        # The ledger id it is claimed under: what a wake-up card and a summary name it by.
        meta["delivery_id"] = _text_preview(delivery_id(event, strict=False), 128)
        meta["status"] = _text_preview(event.status, 64)
        meta["error"] = _text_preview(event.error, _TEXT_PREVIEW_CHARS)
        fields = sorted(
            _safe_str(k) for k, v in event.raw.items() if k != "type" and not is_ledger_mark(k, v)
        )
        meta["fields"] = [*fields[:50]]
    if isinstance(event, AbandonedWork):
        meta["abandoned"] = True
        meta["work_kind"] = work.kind if work is not None else "generic"
        meta["status"] = event.status
        meta["error"] = _text_preview(event.error, _TEXT_PREVIEW_CHARS)
    if event.restored:
        meta["restored"] = True
    return {k: v for k, v in meta.items() if v is not None or k in _KEEP_WHEN_NONE}
