"""How a wake-up text writes the values of an event: times, durations, fields, defanged text.

Shared by every kind's wake text (``gateway.wake_text`` for work, ``gateway.wake_text_timers``
for timers, watches, schedules and inbound events). Everything an event carries is rendered
through ``render_value``, which defangs it (``agent.markers.defang``): it came from a
sub-agent, a command, an MCP server or an inbound event, never from Reveille.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from agent.markers import defang
from delivery.events import CompletionEvent

RESTORED_NOTE = "(Re-delivered after a restart or an interrupted delivery.)"


def parse_time(value: Any) -> datetime | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        if isinstance(value, int | float):
            return datetime.fromtimestamp(float(value), tz=UTC)
        if isinstance(value, str):
            text = value.strip()
            try:
                return datetime.fromtimestamp(float(text), tz=UTC)
            except ValueError:
                pass
            dt = datetime.fromisoformat(text)
            # Reveille writes UTC; a naive stamp is read the same way rather than as local.
            return dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)
    except (ValueError, OverflowError, OSError):
        return None
    return None


def iso(dt: datetime) -> str:
    return dt.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def human_duration(value: Any) -> str:
    if isinstance(value, bool):
        return str(value)
    try:
        seconds = float(value)
    except (TypeError, ValueError, OverflowError):
        return render_value(value)
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        return str(seconds)
    if seconds < 0:
        return f"{seconds:g}s"
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours:02d}h {minutes:02d}m"
    if hours:
        return f"{hours}h {minutes:02d}m {secs:02d}s"
    return f"{minutes}m {secs:02d}s"


def when(value: Any, now: float) -> str:
    dt = parse_time(value)
    if dt is None:
        return render_value(value)
    ago = now - dt.timestamp()
    if ago < 0:
        return f"{iso(dt)} (in the future by {human_duration(-ago)}; clock skew?)"
    if ago < 1:
        return f"{iso(dt)} (just now)"
    return f"{iso(dt)} ({human_duration(ago)} ago)"


def render_value(value: Any) -> str:
    """Any value of an event as text, defanged (``agent.markers.defang``: it came from a
    sub-agent, a command, an MCP server or an inbound event, never from Reveille); never
    raises (huge ints, deep nesting, odd objects)."""
    return defang(as_text(value))


def as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        if isinstance(value, Mapping | list | tuple):
            return json.dumps(value, indent=2, ensure_ascii=False, default=str)
        return str(value)
    except (ValueError, RecursionError, TypeError):
        if isinstance(value, int):
            return f"<integer of {value.bit_length()} bits>"
        return f"<{type(value).__name__} that cannot be rendered>"


def field(label: str, value: Any) -> str:
    text = render_value(value)
    # Multi-line values go below their label so the text stays readable.
    return f"{label}:\n{text}" if "\n" in text else f"{label}: {text}"


def present(value: Any) -> bool:
    return value is not None and value != "" and value != [] and value != {}


def redelivered(evt: CompletionEvent) -> bool:
    """The ledger offers this event again (a restart, an orphan re-offer) after a consumer
    took it before; a first offer by another process than its writer is not "again"."""
    return evt.restored and not evt.raw.get("_first_offer")
