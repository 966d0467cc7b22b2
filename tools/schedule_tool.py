"""The `schedule` tool: the agent makes recurring wake-ups of this conversation, and lists,
pauses, resumes and cancels them.

A schedule is a cron expression in an IANA zone, or an interval (``every_seconds``); each
occurrence comes home like a one-shot wake-up (``tools.wakeup_tool``), restating its note,
through the ledger (``delivery.schedules_engine``): exactly once per occurrence, on every
surface. It is in the ``timers`` toolset, so a sub-agent gets it only when its dispatch
names it (a schedule outlives the sub-agent), within the same ``max_depth`` rules.

The engine is the composition root's (``install``), as the delegation runtime is: one per
process, over the store every server shares.

Bounds: a period of at least ``[timers] min_delay_seconds`` (for cron: between its next
occurrences), at most ``MAX_SCHEDULES_PER_SESSION`` active or paused per conversation, a
note of at most ``MAX_NOTE_CHARS``. Another conversation's schedule is "not found".
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo

from agent.messages import JSONObject
from agent.tool_args import as_number, required_note
from agent.tools import Tool, ToolContext
from delivery.schedules import (
    Misfire,
    Schedule,
    ScheduleError,
    Target,
    check_cron,
    next_instant,
    parse_misfire,
    zone_of,
)
from delivery.schedules_engine import ScheduleEngine, ScheduleNotFound
from tools.wakeup_tool import MAX_NOTE_CHARS, MIN_DELAY_SECONDS, WAKEUP_TOOLSET

__all__ = [
    "MAX_SCHEDULES_PER_SESSION",
    "SCHEDULE_TOOL",
    "describe",
    "install",
    "installed",
    "make_schedule_tool",
]

SCHEDULE_TOOL = "schedule"
MAX_SCHEDULES_PER_SESSION = 50
_ACTIONS = ("create", "list", "pause", "resume", "cancel")

_engine: ScheduleEngine | None = None


def install(engine: ScheduleEngine | None) -> None:
    """Make ``engine`` the one the tool uses (the composition root; None: none)."""
    global _engine
    _engine = engine


def installed() -> ScheduleEngine | None:
    return _engine


PARAMETERS: JSONObject = {
    "type": "object",
    "properties": {
        "action": {"type": "string", "enum": list(_ACTIONS)},
        "note": {
            "type": "string",
            "description": "create: what to do at each occurrence; restated to you then.",
        },
        "cron": {
            "type": "string",
            "description": "create: a cron expression, e.g. '0 9 * * 1-5' (weekdays 9:00). "
            "Give this or every_seconds.",
        },
        "tz": {
            "type": "string",
            "description": "create with cron: an IANA time zone, e.g. Europe/Berlin (UTC if "
            "omitted).",
        },
        "every_seconds": {"type": "number", "description": "create: the period, in seconds."},
        "misfire": {
            "type": "string",
            "description": "create: what an occurrence missed while the server was down "
            "does: fire_once (default: one firing that says how many were missed), skip "
            "(a 'missed' notice instead), or 'fire_if_within 10m'.",
        },
        "target": {
            "type": "string",
            "enum": ["this", "own"],
            "description": "create: where occurrences come home: this conversation "
            "(default) or 'own', a new conversation per schedule that the user can continue.",
        },
        "id": {"type": "string", "description": "pause, resume, cancel: the schedule's id."},
    },
    "required": ["action"],
}

DESCRIPTION = (
    "Recurring wake-ups of this conversation. action=create with a note and either cron "
    "(+ tz, an IANA zone) or every_seconds; misfire says what an occurrence missed while "
    "the server was down does. action=list shows this conversation's schedules; pause, "
    "resume and cancel take the id. Each occurrence comes back to you once, even across "
    "restarts and DST changes."
)


def _iso(when: float | None, zone: str = "UTC") -> str | None:
    if when is None:
        return None
    return datetime.fromtimestamp(when, ZoneInfo(zone)).isoformat(timespec="seconds")


def describe(schedule: Schedule) -> JSONObject:
    """A schedule as the tool, the API and the CLI show it (JSON)."""
    return {
        "id": schedule.id,
        "note": schedule.note,
        "state": schedule.state,
        "cron": schedule.cron,
        "tz": schedule.zone,
        "every_seconds": schedule.every_seconds,
        "misfire": schedule.misfire.describe(),
        "target": schedule.target,
        "next_due_at": _iso(schedule.next_at, schedule.zone),
        "next_due_epoch": schedule.next_at,
        "fired": schedule.fired,
        "missed": schedule.missed,
        "last_fired_at": _iso(schedule.last_fired_at, schedule.zone),
        "session": schedule.session,
        "created_at": _iso(schedule.created_at),
    }


@dataclass(frozen=True, slots=True)
class _Spec:
    """A valid create request: the keywords of ``ScheduleEngine.create``."""

    note: str
    cron: str | None
    zone: str
    every_seconds: float | None
    misfire: Misfire
    target: Target


def _spec(args: Mapping[str, object], now: float, min_delay: float) -> _Spec:
    """The keywords of ``ScheduleEngine.create`` that ``args`` ask for, or ScheduleError."""
    note = required_note(
        args.get("note"),
        purpose="what to do at each occurrence",
        max_chars=MAX_NOTE_CHARS,
        error=ScheduleError,
    )
    cron, every = args.get("cron"), args.get("every_seconds")
    if (cron is None) == (every is None):
        raise ScheduleError("give exactly one of cron (with tz) or every_seconds")
    target = args.get("target") or "this"
    if target not in ("this", "own"):
        raise ScheduleError(
            "target must be 'this' (this conversation) or 'own' (a conversation of its own)"
        )
    misfire: Misfire = parse_misfire(args.get("misfire"))
    if every is not None:
        period = as_number(every)
        if period is None or not math.isfinite(period):
            raise ScheduleError("every_seconds must be a number of seconds")
        if period < min_delay:
            raise ScheduleError(
                f"every_seconds must be at least {min_delay:g} (the timers' min delay)"
            )
        if period > 365 * 86400:
            raise ScheduleError("every_seconds must be at most 365 days")
        return _Spec(note, None, "UTC", period, misfire, target)
    expr = check_cron(str(cron))
    tz = args.get("tz") or "UTC"
    zone_of(str(tz))
    probe = Schedule(
        "probe", note, expr, str(tz), None, now, misfire, "this", "active",
        None, None, None, now, now, None,
    )  # fmt: skip
    first = next_instant(probe, now)
    second = next_instant(probe, first)
    if second - first < min_delay:
        raise ScheduleError(
            f"cron {expr!r} fires {second - first:g} s apart; the period must be at least "
            f"{min_delay:g} s (the timers' min delay)"
        )
    return _Spec(note, expr, str(tz), None, misfire, target)


def _run(
    engine: ScheduleEngine, args: Mapping[str, object], ctx: ToolContext, min_delay: float
) -> JSONObject:
    """The action (blocking store work: run in a thread)."""
    session = ctx.origin_ui_session_id or ctx.session_id or ctx.session_key
    action = args.get("action")
    if action not in _ACTIONS:
        return {"error": f"action must be one of {', '.join(_ACTIONS)}"}
    if action == "list":
        found = engine.find(session=session) if session is not None else []
        return {"schedules": [describe(s) for s in found]}
    if action == "create":
        now = engine.clock()
        spec = _spec(args, now, min_delay)
        if session is not None and engine.store.count_active(session) >= MAX_SCHEDULES_PER_SESSION:
            return {
                "error": f"this conversation already has {MAX_SCHEDULES_PER_SESSION} "
                "schedules; cancel one first"
            }
        made = engine.create(
            note=spec.note,
            cron=spec.cron,
            zone=spec.zone,
            every_seconds=spec.every_seconds,
            misfire=spec.misfire,
            target=spec.target,
            session_key=ctx.session_key,
            origin_session_id=ctx.session_id,
            origin_ui_session_id=ctx.origin_ui_session_id,
        )
        return {"status": "scheduled", **describe(made)}
    schedule_id = args.get("id")
    if not isinstance(schedule_id, str) or not schedule_id.strip():
        return {"error": f"{action} needs the schedule's id (see action=list)"}
    try:
        if action == "pause":
            done = engine.pause(schedule_id.strip(), session=session or "")
        elif action == "resume":
            done = engine.resume(schedule_id.strip(), session=session or "")
        else:
            done = engine.cancel(schedule_id.strip(), session=session or "", by="agent")
    except ScheduleNotFound:
        return {"error": f"schedule {schedule_id[:80]!r} not found in this conversation"}
    return {"status": done.state, **describe(done)}


def make_schedule_tool(*, min_delay_seconds: float = MIN_DELAY_SECONDS) -> Tool:
    """`schedule`, in the ``timers`` toolset beside `schedule_wakeup`."""

    async def handler(args: Mapping[str, object], ctx: ToolContext) -> JSONObject:
        engine = _engine
        if engine is None:
            return {"error": "schedules are not available in this process"}
        if args.get("action") == "create":
            await ctx.prepare_background()  # its origin session is written before any firing
        try:
            return await asyncio.to_thread(_run, engine, dict(args), ctx, min_delay_seconds)
        except ScheduleError as exc:
            return {"error": str(exc)}

    return Tool(
        name=SCHEDULE_TOOL,
        description=DESCRIPTION,
        parameters=PARAMETERS,
        handler=handler,
        toolset=WAKEUP_TOOLSET,
    )
