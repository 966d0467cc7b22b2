"""What a chat's ``/timers`` command answers: the chat's recurring schedules and the reminders
not due yet, each with its id, its next due time in its zone and its note. Shared by the chat
platforms: Telegram answers its bot command itself, Discord its application command, and a
typed ``/timers`` on Discord, Matrix and Slack is answered by ``ChatTurns`` (no turn) through
``asks_for_timers`` and ``timers_answer``. The operators' view of the same is
`reveille schedules list`."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from zoneinfo import ZoneInfo

from delivery.cancel import active_units
from delivery.events import TIMER_KIND
from delivery.schedules import Schedule
from tools.delegation_runtime import get_runtime
from tools.schedule_tool import installed

__all__ = ["asks_for_timers", "timers_answer", "timers_text"]

_MAX_LINES = 30


def _when(at: float | None, zone: str) -> str:
    if at is None:
        return "—"
    return datetime.fromtimestamp(at, ZoneInfo(zone)).strftime("%Y-%m-%d %H:%M %Z")


def _schedule_line(s: Schedule) -> str:
    spec = f"cron {s.cron} ({s.zone})" if s.cron is not None else f"every {s.every_seconds:g} s"
    state = "" if s.state == "active" else f" [{s.state}]"
    return f"• {s.id}{state}: {s.note} — {spec}, next {_when(s.next_at, s.zone)}"


def timers_text(session_id: str, now: float | None = None) -> str:
    """The answer to ``/timers`` for the conversation ``session_id`` (blocking: a thread)."""
    now = time.time() if now is None else now
    lines: list[str] = []
    engine = installed()
    if engine is not None:
        lines += [_schedule_line(s) for s in engine.find(session=session_id)]
    units = active_units(get_runtime().ledger.views, now, session=session_id)
    lines += [
        f"• {u.id}: {u.goal or '(no note)'} — once, {_when(u.due_at, 'UTC')}"
        for u in units
        if u.kind == TIMER_KIND
    ]
    if not lines:
        return "Nothing is scheduled here."
    more = len(lines) - _MAX_LINES
    shown = lines[:_MAX_LINES] + ([f"… and {more} more"] if more > 0 else [])
    return "Scheduled here:\n" + "\n".join(shown)


def asks_for_timers(text: str) -> bool:
    """Whether a chat message is the ``/timers`` command: its first word, any case, with
    Telegram's ``@bot`` suffix allowed (``/Timers@my_bot`` asks too; words after it are
    ignored)."""
    words = text.split(maxsplit=1)
    return bool(words) and words[0].split("@", 1)[0].lower() == "/timers"


async def timers_answer(session_id: str) -> str:
    """``timers_text`` off the event loop (it reads the store)."""
    return await asyncio.to_thread(timers_text, session_id)
