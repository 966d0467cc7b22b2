"""Wake-up texts of what comes due at a time: wake-ups, watches, schedules, inbound events.

``gateway.wake_text`` (which renders every kind and owns the combined batches) calls
``format_scheduled_wakeup`` and ``format_inbound`` here; each restates the agent's note and
what fired it, defanged (``gateway.wake_render.render_value``).
"""

from __future__ import annotations

from delivery.events import InboundWakeupEvent, ScheduledWakeupEvent
from gateway.wake_render import RESTORED_NOTE, field, present, redelivered, render_value, when

_WATCH_HEADS = {
    "fired": "[Watch fired] a watch you set says now.",
    "expired": "[Watch expired] a watch you set ran out its lifetime; it watches no more.",
    "ended": "[Watch ended] the process a watch of yours followed has exited; it watches no more.",
    "cancelled": "[Watch cancelled] a watch you set was cancelled; it watches no more.",
}


def _format_watch(evt: ScheduledWakeupEvent, now: float, *, explain: bool = True) -> str:
    """A watch fired or ended: it restates the note and what matched (the output line, a
    command's stdout: defanged, since a command wrote it) and what the watch does next."""
    out = [_WATCH_HEADS.get(evt.watch_event or "", _WATCH_HEADS["fired"])]
    if explain:
        out.append(
            "This is an automatic wake-up, not a user message: earlier in this conversation "
            "you set a watch with the note below. Act on it."
        )
    if redelivered(evt):
        out.append(RESTORED_NOTE)
    out.append("")
    out.append(f"Watch: {render_value(evt.watch_id)}")
    if evt.fires is not None:
        out.append(f"Fired: {evt.fires} time(s) so far")
    if present(evt.dispatched_at):
        out.append("Set: " + when(evt.dispatched_at, now))
    if present(evt.completed_at):
        out.append("At: " + when(evt.completed_at, now))
    if evt.status and evt.status.lower() not in ("completed", "expired", "ended"):
        out.append(f"Status: {render_value(evt.status)}")
    if evt.error:
        out.append(field("Error", evt.error))
    out.append("")
    out.append(field("Note", evt.note) if evt.note else "Note: (none)")
    if evt.matched is not None:
        out.append(field("Matched", evt.matched))
    return "\n".join(out).rstrip() + "\n"


def format_scheduled_wakeup(evt: ScheduledWakeupEvent, now: float, *, explain: bool = True) -> str:
    """A wake-up the agent set came due: it restates the note in full (defanged: the model
    wrote it, possibly from what a user or a tool said), when it was set and for when."""
    if evt.watch_id is not None:
        return _format_watch(evt, now, explain=explain)
    missed = evt.status == "missed"
    if missed:
        out = ["[Missed occurrence] an occurrence of a schedule you set did not run."]
    elif evt.schedule_id is not None:
        out = ["[Scheduled wake-up] an occurrence of a schedule you set is due."]
    else:
        out = ["[Scheduled wake-up] a wake-up you set is due."]
    if explain and missed:
        out.append(
            "This is an automatic notice, not a user message: no server was running at its "
            "time and its misfire policy skips late occurrences. Do not act on the note; "
            "tell the user it was missed if that matters."
        )
    elif explain:
        out.append(
            "This is an automatic wake-up, not a user message: earlier in this conversation "
            "you asked to be woken now, with the note below. Act on it."
        )
    if redelivered(evt):
        out.append(RESTORED_NOTE)
    out.append("")
    if evt.delivery_id is not None:
        out.append(f"Wake-up: {render_value(evt.delivery_id)}")
    if evt.schedule_id is not None:
        spec = f" ({render_value(evt.schedule)})" if evt.schedule else ""
        out.append(f"Schedule: {render_value(evt.schedule_id)}{spec}")
    if evt.due_at is not None:
        zone = f" ({render_value(evt.zone)})" if evt.zone else ""
        out.append(f"Due: {when(evt.due_at, now)}{zone}")
    if evt.missed:
        out.append(
            f"Missed: {evt.missed} more occurrence(s) while no server was running"
            + ("" if missed else "; this one firing stands for them")
        )
    if present(evt.dispatched_at):
        out.append("Set: " + when(evt.dispatched_at, now))
    out.append("")
    out.append(field("Note", evt.note) if evt.note else "Note: (none)")
    return "\n".join(out).rstrip() + "\n"


def format_inbound(evt: InboundWakeupEvent, now: float, *, explain: bool = True) -> str:
    """An inbound event came for this conversation, or a wait for one expired. The payload
    is restated in full and defanged: whoever holds the hook's secret wrote it."""
    hook = render_value(evt.hook) if evt.hook else "?"
    if evt.outcome == "expired":
        out = [f"[Inbound event] the wait on hook {hook} expired: no matching event came."]
    else:
        out = [f"[Inbound event] an event came on hook {hook}."]
    if explain:
        what = {
            "matched": "earlier in this conversation you asked to be woken when it came",
            "expired": "earlier in this conversation you asked to be woken when an event "
            "came; none matched in time, so nothing happened. Decide what to do now",
            "event": "this hook's events are routed to this conversation",
        }.get(evt.outcome or "event", "an event came")
        out.append(f"This is an automatic wake-up, not a user message: {what}.")
    if redelivered(evt):
        out.append(RESTORED_NOTE)
    out.append("")
    if evt.delivery_id is not None:
        out.append(f"Wake-up: {render_value(evt.delivery_id)}")
    if evt.match:
        out.append(field("Waiting for", evt.match))
    if evt.webhook_id:
        out.append(field("Event id", evt.webhook_id))
    if evt.received_at is not None:
        out.append("Received: " + when(evt.received_at, now))
    elif evt.due_at is not None and evt.outcome == "expired":
        out.append("Expired: " + when(evt.due_at, now))
    if present(evt.dispatched_at) and evt.outcome != "event":
        out.append("Set: " + when(evt.dispatched_at, now))
    if evt.note:
        out.append(field("Note", evt.note))
    if evt.payload is not None:
        out.append("")
        out.append(field("Payload", evt.payload))
    return "\n".join(out).rstrip() + "\n"
