"""The `schedule_wakeup` tool: the agent wakes this conversation later, with a note to itself.

A wake-up is a ledger row whose completion is the passing of time: its event (the note, the
instant) is written when it is set, due from that instant on (``Ledger.schedule``). When it
comes due, whichever server shares the store offers it, and it reaches the conversation like
any other result (a transcript row, a web UI card and turn, a chat push), waits behind an
approval or a running turn and combines with sibling results. The claim decides who fires
it, so a restart, a replay or a second server never fires it twice; ``reveille background
cancel ID`` cancels it until it is due.

Bounds: 10 s (``[timers] min_delay_seconds``) to 365 days ahead, a note of at most
``MAX_NOTE_CHARS``, at most ``MAX_PENDING_PER_SESSION`` pending per conversation (counted
before the write: wake-ups set at the same instant on several servers can pass it by one
each).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from agent.messages import JSONObject
from agent.tool_args import as_number, required_note
from agent.tools import Tool, ToolContext
from delivery import traces
from delivery.events import SCHEDULED_WAKEUP, TIMER_KIND
from delivery.ids import new_id
from delivery.rows import RowQuery

if TYPE_CHECKING:
    from delivery.ledger import Ledger

__all__ = [
    "MAX_DELAY_SECONDS",
    "MAX_NOTE_CHARS",
    "MAX_PENDING_PER_SESSION",
    "MIN_DELAY_SECONDS",
    "TIMER_KIND",
    "WAKEUP_TOOLSET",
    "WakeupRequest",
    "iso_utc",
    "make_wakeup_tool",
    "parse_wakeup",
    "pending_cap_error",
    "set_parsed",
]

Wanted = TypeVar("Wanted")

WAKEUP_TOOLSET = "timers"
MIN_DELAY_SECONDS = 10.0
MAX_DELAY_SECONDS = 365 * 86400.0
MAX_PENDING_PER_SESSION = 50
MAX_NOTE_CHARS = 4000

PARAMETERS: JSONObject = {
    "type": "object",
    "properties": {
        "note": {
            "type": "string",
            "description": "What to do or remember when woken; it is restated to you then.",
        },
        "in_seconds": {
            "type": "number",
            "description": "Wake after this many seconds (10 to 31536000). Give this or at.",
        },
        "at": {
            "type": "string",
            "description": "Wake at this instant: ISO 8601 with a zone, e.g. "
            "2026-03-01T09:00:00+01:00 or 2026-03-01T08:00:00Z. Give this or in_seconds.",
        },
    },
    "required": ["note"],
}

DESCRIPTION = (
    "Wake this conversation later with a note to yourself: after in_seconds, or at an "
    "instant (ISO 8601 with a zone). The note comes back to you as a wake-up then, even "
    "across restarts. Between 10 seconds and 365 days ahead; at most 50 pending."
)


class WakeupError(ValueError):
    """Arguments a wake-up cannot be set with; the message says what to give instead."""


@dataclass(frozen=True, slots=True)
class WakeupRequest:
    """A valid wake-up: when (epoch seconds), the zone it was given in, and the note."""

    due_at: float
    zone: str
    note: str


def parse_wakeup(
    args: JSONObject, now: float, *, min_delay_seconds: float = MIN_DELAY_SECONDS
) -> WakeupRequest:
    """The wake-up ``args`` ask for, or WakeupError saying what is wrong."""
    note = required_note(
        args.get("note"),
        purpose="what to do when woken",
        max_chars=MAX_NOTE_CHARS,
        error=WakeupError,
    )
    at, delay = args.get("at"), args.get("in_seconds")
    if (at is None) == (delay is None):
        raise WakeupError("give exactly one of in_seconds (a number) or at (ISO 8601 with zone)")
    if delay is not None:
        seconds = as_number(delay)
        if seconds is None or not math.isfinite(seconds):
            raise WakeupError("in_seconds must be a number of seconds")
        due, zone = now + seconds, "UTC"
    else:
        if not isinstance(at, str) or not at.strip():
            raise WakeupError("at must be an ISO 8601 instant with a zone")
        try:
            when = datetime.fromisoformat(at.strip().replace("z", "Z"))
        except ValueError:
            raise WakeupError(
                f"at {at[:64]!r} is not ISO 8601; e.g. 2026-03-01T09:00:00+01:00"
            ) from None
        if when.tzinfo is None or when.utcoffset() is None:
            raise WakeupError(
                "at has no zone: add one (Z for UTC, or an offset such as +01:00), so that "
                "the instant is not a guess"
            )
        due, zone = when.timestamp(), when.tzname() or "UTC"
    ahead = due - now
    if ahead < min_delay_seconds:
        raise WakeupError(
            f"a wake-up must be at least {min_delay_seconds:g} seconds ahead "
            f"(this one is {ahead:.0f} s)"
        )
    if ahead > MAX_DELAY_SECONDS:
        raise WakeupError(
            f"a wake-up must be at most 365 days ahead (this one is {ahead / 86400:.0f} days)"
        )
    return WakeupRequest(due, zone, note)


def iso_utc(when: float) -> str:
    """``when`` as the timers tools tell it: ISO 8601 in UTC, to the second (``...Z``)."""
    return datetime.fromtimestamp(when, tz=UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


async def set_parsed(
    ctx: ToolContext,
    parse: Callable[[], Wanted],
    refused: type[ValueError],
    write: Callable[[Wanted], JSONObject],
) -> JSONObject:
    """The tail the timers tools' handlers share: the arguments parsed (``refused`` is the
    tool's error, nothing written), the origin session written before any result can come,
    then ``write`` in a thread (blocking store work)."""
    try:
        wanted = parse()
    except refused as exc:
        return {"error": str(exc)}
    await ctx.prepare_background()
    return await asyncio.to_thread(write, wanted)


def pending_cap_error(
    ledger: Ledger, ctx: ToolContext, kind: str, many: str, or_else: str
) -> JSONObject | None:
    """The tool's error when the conversation of ``ctx`` has ``MAX_PENDING_PER_SESSION``
    pending rows of ``kind`` already (``many`` wake-ups, or waits), else None."""
    session = ctx.origin_ui_session_id or ctx.session_id or ctx.session_key
    if session is None:
        return None
    query = RowQuery(
        kind=kind, delivery_state="pending", session=session, limit=MAX_PENDING_PER_SESSION + 1
    )
    if len(ledger.query(query)) < MAX_PENDING_PER_SESSION:
        return None
    return {
        "error": f"this conversation already has {MAX_PENDING_PER_SESSION} {many}; "
        f"cancel one (reveille background cancel ID) or {or_else}"
    }


def _set_wakeup(ctx: ToolContext, wanted: WakeupRequest, now: float) -> JSONObject:
    """Write the row (a blocking store write: run in a thread)."""
    # Resolved at call time, like the process tool: a substituted runtime is honoured.
    from tools.delegation_runtime import get_runtime, stamp_response_origin

    ledger = get_runtime().ledger
    if refused := pending_cap_error(
        ledger, ctx, TIMER_KIND, "pending wake-ups", "wait for one to fire"
    ):
        return refused
    row_id = new_id("tmr_")
    event: JSONObject = {
        "type": SCHEDULED_WAKEUP,
        "delivery_id": row_id,
        "status": "completed",
        "note": wanted.note,
        "due_at": wanted.due_at,
        "zone": wanted.zone,
        "session_key": ctx.session_key,
        "origin_session_id": ctx.session_id,
        "origin_ui_session_id": ctx.origin_ui_session_id,
        "dispatched_at": now,
        "completed_at": wanted.due_at,
    }
    if traceparent := traces.turn_traceparent():
        event[traces.TRACEPARENT] = traceparent
    stamp_response_origin(event)
    ledger.schedule(
        row_id,
        kind=TIMER_KIND,
        event=event,
        not_before=wanted.due_at,
        session_key=ctx.session_key,
        origin_session_id=ctx.session_id,
        origin_ui_session_id=ctx.origin_ui_session_id,
        goal=wanted.note,
    )
    return {
        "status": "scheduled",
        "wakeup_id": row_id,
        "due_at": iso_utc(wanted.due_at),
        "in_seconds": round(wanted.due_at - now, 1),
        "note": wanted.note,
    }


def make_wakeup_tool(
    *, min_delay_seconds: float = MIN_DELAY_SECONDS, clock: Any = time.time
) -> Tool:
    """`schedule_wakeup`, in its own toolset (``WAKEUP_TOOLSET``): a sub-agent gets it only
    when its dispatch names it. ``min_delay_seconds``: the nearest a wake-up may be (the
    setting ``[timers] min_delay_seconds``, 10 s by default)."""

    async def handler(args: JSONObject, ctx: ToolContext) -> JSONObject:
        now = clock()
        return await set_parsed(
            ctx,
            partial(parse_wakeup, args, now, min_delay_seconds=min_delay_seconds),
            WakeupError,
            lambda wanted: _set_wakeup(ctx, wanted, now),
        )

    return Tool(
        name="schedule_wakeup",
        description=DESCRIPTION,
        parameters=PARAMETERS,
        handler=handler,
        toolset=WAKEUP_TOOLSET,
    )
