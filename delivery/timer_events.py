"""The timer family of completion events: what comes due at a time rather than when work ends.

``ScheduledWakeupEvent`` (a wake-up the agent set, a watch firing or ending, a recurring
schedule's occurrence) and ``InboundWakeupEvent`` (an inbound event routed to a conversation,
or a ``wake_when`` wait matched or expired), their ``type`` literals and ledger kinds, and
their parsers. ``delivery.events.parse_event`` dispatches to ``parse_scheduled_wakeup`` and
``parse_inbound``; import the names from ``delivery.events``, which re-exports them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from delivery.event_base import CompletionEvent, EventKind, common_fields, opt_str

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


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def parse_scheduled_wakeup(raw: Mapping[str, Any]) -> ScheduledWakeupEvent:
    return ScheduledWakeupEvent(
        **common_fields(raw),
        delivery_id=opt_str(raw.get("delivery_id")),
        note=opt_str(raw.get("note")),
        due_at=_number(raw.get("due_at")),
        zone=opt_str(raw.get("zone")),
        watch_id=opt_str(raw.get("watch_id")),
        watch_event=opt_str(raw.get("watch_event")),
        matched=opt_str(raw.get("matched")),
        fires=int(fires) if (fires := _number(raw.get("fires"))) is not None else None,
        schedule_id=opt_str(raw.get("schedule_id")),
        schedule=opt_str(raw.get("schedule")),
        missed=int(_number(raw.get("missed")) or 0),
    )


def parse_inbound(raw: Mapping[str, Any]) -> InboundWakeupEvent:
    payload = raw.get("payload")
    return InboundWakeupEvent(
        **common_fields(raw),
        delivery_id=opt_str(raw.get("delivery_id")),
        note=opt_str(raw.get("note")),
        due_at=_number(raw.get("due_at")),
        zone=opt_str(raw.get("zone")),
        hook=opt_str(raw.get("hook")),
        webhook_id=opt_str(raw.get("webhook_id")),
        received_at=_number(raw.get("received_at")),
        payload=payload if isinstance(payload, str) else None,
        outcome=opt_str(raw.get("outcome")),
        match=opt_str(raw.get("match")),
    )
