"""Wake-up texts: a completion event rendered for the model that will read it.

The text is self-contained (the agent may be deep in other work when it arrives): it
restates the goal, the context, when the work was dispatched and the full result
(``format_wake_text`` never truncates). The first line starts with
``agent.markers.WAKE_MARKER``; the last line is
``agent.markers.wake_data_line(display_metadata(evt))``, the same facts as JSON, for readers
that want fields instead of prose.

``format_wake_batch`` is what a wake-up turn carries: one or several results of one session
(combined wake-ups, ``gateway.coalesce``) in ONE text, each with its delivery id, goal,
status and result, within a text budget: results too long to fit are cut, each with a
pointer to the full one (``reveille deliveries show <id>``, the web UI's wake-up card). A
combined text ends with one ``WAKE_DATA_MARKER`` line per result, in order.

Everything an event carries (a sub-agent's result, a command's output, an MCP result, an
inbound event's fields, goals, ids) is defanged where it is rendered
(``gateway.wake_render.render_value``, ``agent.markers.defang``), in a single wake-up as in
a combined one: only the lines this module writes are structure. ``wake_results`` gives the
data lines this module wrote, read from where it wrote them (the turn that stores a wake-up
keeps them in the row's metadata). The texts of timers, watches, schedules and inbound
events are written in ``gateway.wake_text_timers``.

Rendering works on the typed event (``delivery.events.parse_event``); wire dicts are parsed
here, once.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from agent.markers import WAKE_DATA_MARKER, WAKE_MARKER, defang, read_wake_data, wake_data_line
from agent.messages import JSONObject
from agent.subagent import describe_tools_used
from delivery.event_display import display_metadata
from delivery.events import (
    AbandonedWork,
    CompletionEvent,
    DelegationBatchEvent,
    DelegationEvent,
    DelegationResult,
    InboundWakeupEvent,
    ProcessCompletionEvent,
    ScheduledWakeupEvent,
    delegation_counts,
    delivery_id,
    is_ledger_mark,
    parse_event,
)
from gateway.wake_render import (
    RESTORED_NOTE,
    field,
    human_duration,
    present,
    redelivered,
    render_value,
    when,
)
from gateway.wake_text_timers import format_inbound, format_scheduled_wakeup

__all__ = [
    "DEFAULT_WAKE_TEXT_BUDGET",
    "WAKE_RESULTS_KEY",
    "delegation_counts",
    "format_wake_batch",
    "format_wake_text",
    "is_combined_wake",
    "wake_batch_key",
    "wake_results",
    "wake_row_metadata",
]

_ABNORMAL_STATUSES = frozenset({"interrupted", "unknown", "cancelled", "error", "stalled"})


def _outcome_lines(summary: Any, error: Any, extra: Any) -> list[str]:
    lines: list[str] = []
    if present(summary):
        lines.append("Result:\n" + render_value(summary))
    if present(error):
        lines.append("Error:\n" + render_value(error))
    if not lines:
        if present(extra):
            lines.append("Result:\n" + render_value(extra))
        else:
            lines.append("Result: (no summary or error was returned)")
    return lines


def _common_delegation_lines(evt: DelegationEvent | DelegationBatchEvent, now: float) -> list[str]:
    lines: list[str] = []
    for value, label in ((evt.context, "Context"), (evt.role, "Role"), (evt.model, "Model")):
        if present(value):
            lines.append(field(label, value))
    if evt.toolsets:
        lines.append(field("Toolsets", ", ".join(evt.toolsets)))
    if tools_used := describe_tools_used(evt.raw.get("tools_used")):
        lines.append(defang(tools_used))
    if present(evt.dispatched_at):
        lines.append("Dispatched: " + when(evt.dispatched_at, now))
    if present(evt.completed_at):
        lines.append("Completed: " + when(evt.completed_at, now))
    return lines


def _batch_results(evt: DelegationBatchEvent) -> list[str]:
    out = ["Results:"]
    total = len(evt.results)
    for i, result in enumerate(evt.results):
        out.append("")
        out.extend(_batch_item(evt, i, total, result))
    if not total:
        out.append("(no per-task results were recorded)")
        out.extend(_outcome_lines(evt.summary, evt.error, evt.result))
    return out


def _batch_item(
    evt: DelegationBatchEvent, i: int, total: int, result: DelegationResult
) -> list[str]:
    if not isinstance(result.raw, Mapping):
        return [f"### Task {i + 1} of {total}", render_value(result.raw)]
    head = f"### Task {i + 1} of {total}: {render_value(result.status or 'unknown')}"
    if result.duration_seconds is not None:
        head += f" ({human_duration(result.duration_seconds)})"
    out = [head]
    goal = evt.goal_of(i)
    if present(goal):
        out.append(field("Goal", goal))
    out.extend(_outcome_lines(result.summary, result.error, result.result))
    return out


def _format_delegation(
    evt: DelegationEvent | DelegationBatchEvent, now: float, *, explain: bool = True
) -> str:
    delegation_id = render_value(evt.delegation_id or "(unknown id)")
    status = render_value(evt.status) if evt.status else evt.status
    batch = isinstance(evt, DelegationBatchEvent)
    out: list[str] = []
    if isinstance(evt, DelegationBatchEvent):
        counts = delegation_counts(evt)
        out.append(
            f"[Background delegation batch finished] {delegation_id}: {counts['tasks']} "
            f"task(s), {counts['completed']} completed, {counts['failed']} failed."
        )
    else:
        out.append(
            f"[Background delegation finished] {delegation_id}: status {status or 'unknown'}."
        )
    if explain:
        out.append(
            "This is an automatic wake-up, not a user message: work you delegated earlier has "
            "ended. It restates what was asked so you can act on it even if you are in the "
            "middle of something else."
        )
    if redelivered(evt):
        out.append(RESTORED_NOTE)
    out.append("")

    if isinstance(evt, DelegationBatchEvent):
        out.append("Goals:")
        out.extend(f"  {i}. {render_value(goal)}" for i, goal in enumerate(evt.goals, 1))
    elif present(evt.goal):
        out.append(field("Goal", evt.goal))
    out.extend(_common_delegation_lines(evt, now))
    if isinstance(evt, DelegationBatchEvent):
        duration = evt.total_duration_seconds
    else:
        duration = evt.duration_seconds
    if duration is not None:
        out.append(("Total duration: " if batch else "Duration: ") + human_duration(duration))
    if status:
        out.append(f"Status: {status}")
    if status and status.lower() in _ABNORMAL_STATUSES:
        out.append(
            f"Note: the work did not finish normally ({status}); what is known is reported below."
        )
    out.append("")
    if isinstance(evt, DelegationBatchEvent):
        out.extend(_batch_results(evt))
    else:
        out.extend(_outcome_lines(evt.summary, evt.error, evt.result))
    return "\n".join(out).rstrip() + "\n"


def _format_process_completion(
    evt: ProcessCompletionEvent, now: float, *, explain: bool = True
) -> str:
    code_text = "unknown" if evt.exit_code is None else render_value(evt.exit_code)
    lost = evt.exit_code is None and (evt.status or "").lower() == "unknown"
    stopped = (evt.status or "").lower() == "cancelled"
    if stopped:  # a person stopped it: short, and says who (the error does)
        out = ["[Background process stopped] it was cancelled before it exited."]
    else:
        out = [f"[Background process finished] exit code {code_text}."]
    if explain:
        out.append(
            "This is an automatic wake-up, not a user message: a background command you "
            "started "
            + (
                "earlier can no longer be followed; whether and how it ended is unknown."
                if lost
                else "earlier was stopped; do not expect its result."
                if stopped
                else "earlier has exited."
            )
        )
    if redelivered(evt):
        out.append(RESTORED_NOTE)
    out.append("")
    if evt.command is not None:
        out.append(field("Command", evt.command))
    if evt.process_id is not None:
        out.append(f"Process: {render_value(evt.process_id)}")
    if evt.cwd is not None:
        out.append(f"Working directory: {render_value(evt.cwd)}")
    if present(evt.started_at):
        out.append("Started: " + when(evt.started_at, now))
    out.append(f"Exit code: {code_text}")
    if evt.duration_seconds is not None:
        out.append("Duration: " + human_duration(evt.duration_seconds))
    if evt.status and evt.status.lower() in _ABNORMAL_STATUSES:
        out.append(
            f"Note: the command did not finish normally ({render_value(evt.status)}); what "
            "is known is "
            "reported below."
        )
    if evt.error is not None:
        out.append("Error:\n" + render_value(evt.error))
    out.append("")
    if evt.output_tail is not None:
        out.append("Output (tail):")
        out.append(render_value(evt.output_tail))
    else:
        out.append("Output: (none captured)")
    return "\n".join(out).rstrip() + "\n"


def _format_generic(evt: CompletionEvent, *, explain: bool = True) -> str:
    kind = evt.raw.get("type")
    out = [f"[Background event: {render_value(kind) if present(kind) else 'unknown'}]"]
    if explain:
        out.append("This is an automatic wake-up, not a user message.")
    if redelivered(evt):
        out.append(RESTORED_NOTE)
    out.append("")
    for key, value in evt.raw.items():
        # The ledger's bookkeeping (re-offer marks) is not event data.
        if key == "type" or is_ledger_mark(key, value) or value is None:
            continue
        out.append(field(render_value(str(key)), value))
    return "\n".join(out).rstrip() + "\n"


def _body(event: CompletionEvent, now: float, *, explain: bool = True) -> str:
    work = event.work if isinstance(event, AbandonedWork) else event
    if isinstance(work, DelegationEvent | DelegationBatchEvent):
        return _format_delegation(work, now, explain=explain)
    if isinstance(work, ProcessCompletionEvent):
        return _format_process_completion(work, now, explain=explain)
    if isinstance(work, InboundWakeupEvent):
        return format_inbound(work, now, explain=explain)
    if isinstance(work, ScheduledWakeupEvent):
        return format_scheduled_wakeup(work, now, explain=explain)
    return _format_generic(event, explain=explain)


def format_wake_text(evt: Mapping[str, Any] | CompletionEvent, *, now: float | None = None) -> str:
    """Self-contained wake-up text for a completion event; results are never truncated.

    The first line starts with ``agent.markers.WAKE_MARKER``; the last is the event's
    ``display_metadata`` as a ``WAKE_DATA_MARKER`` line. ``now`` (epoch seconds) pins the
    "how long ago" arithmetic for reproducible output.
    """
    event = parse_event(evt)
    current = time.time() if now is None else now
    # The marker opens the first line, so models and front ends can tell a wake-up from
    # something the user typed.
    return f"{WAKE_MARKER} {_body(event, current)}{wake_data_line(display_metadata(event))}\n"


# --------------------------------------------------------------------------- wake batches

DEFAULT_WAKE_TEXT_BUDGET = 24_000
_COMBINED_HEAD = f"{WAKE_MARKER} [Background work finished] "
# Every result keeps at least this much of its text (its id, goal and status come first),
# even when that overruns a small budget: a wake-up that says nothing about a result would
# make the agent redo the work.
_MIN_RESULT_CHARS = 400


def wake_batch_key(delivery_ids: Sequence[str]) -> str:
    """The idempotency key of the wake-up that carries these results: the delivery id of a
    single one, else a digest of the set (the same results re-offered together after a crash
    replay the stored turn instead of running it again)."""
    ids = sorted(set(delivery_ids))
    if len(ids) == 1:
        return ids[0]
    digest = hashlib.sha256("\n".join(ids).encode("utf-8", "surrogatepass")).hexdigest()
    return f"wakes_{digest[:32]}"


def is_combined_wake(text: str) -> bool:
    """Whether a wake-up text carries several results (``format_wake_batch``): then each of
    its data lines is one result's; a single one's is its last (the result text above it is
    not defanged and may hold anything)."""
    return text.startswith(_COMBINED_HEAD)


def _pointer(ident: str | None, shown: int, total: int) -> str:
    where = (
        f"`reveille deliveries show {ident}` or this wake-up's card in the web UI"
        if ident
        else "this wake-up's card in the web UI"
    )
    return (
        f"[... cut by the wake-up text budget: {shown:,} of {total:,} characters shown. "
        f"The full result: {where}.]"
    )


def _cut(body: str, cap: int, ident: str | None) -> str:
    if len(body) <= cap:
        return body
    return body[:cap].rstrip() + "\n" + _pointer(ident, cap, len(body)) + "\n"


def _caps(lengths: Sequence[int], available: int) -> list[int]:
    """How many characters each body may keep: the short ones whole, the long ones an equal
    share of what remains (water-filling), never below ``_MIN_RESULT_CHARS``."""
    caps = list(lengths)
    if sum(lengths) <= available:
        return caps
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    left = available
    for rank, i in enumerate(order):
        share = max(left // (len(order) - rank), _MIN_RESULT_CHARS)
        caps[i] = min(lengths[i], share)
        left -= caps[i]
    return caps


def _status_line(metas: Sequence[Mapping[str, Any]]) -> str:
    counts: dict[str, int] = {}
    for meta in metas:
        status = render_value(str(meta.get("status") or "unknown"))
        counts[status] = counts.get(status, 0) + 1
    return ", ".join(f"{n} {status}" for status, n in counts.items())


def format_wake_batch(
    events: Sequence[Mapping[str, Any] | CompletionEvent],
    *,
    budget: int = DEFAULT_WAKE_TEXT_BUDGET,
    now: float | None = None,
) -> str:
    """The text of ONE wake-up turn carrying ``events`` (in order), within ``budget``
    characters of result text.

    One event that fits is exactly ``format_wake_text``; one that does not keeps its head
    (id, goal, status) and as much of its result as fits, then a pointer to the full one.
    Several events: a header that says how many arrived together and their statuses, then
    per result ``### Result i of n (<delivery id>)`` and its text (the same as a single
    wake-up's, without the repeated explanation), cut the same way when the results together
    overrun the budget; then one data line per result. The data lines (short previews by
    design) are not counted against the budget.
    """
    if not events:
        raise ValueError("format_wake_batch needs at least one event")
    if budget < 1:
        raise ValueError("format_wake_batch: budget must be positive")
    parsed = [parse_event(evt) for evt in events]
    current = time.time() if now is None else now
    metas = [display_metadata(event) for event in parsed]
    ids = [_id_text(delivery_id(event, strict=False)) for event in parsed]
    if len(parsed) == 1:
        body = _body(parsed[0], current)
        (cap,) = _caps([len(body)], budget)
        return f"{WAKE_MARKER} {_cut(body, cap, ids[0])}{wake_data_line(metas[0])}\n"

    total = len(parsed)
    head = [
        f"{_COMBINED_HEAD}{total} results arrived together: {_status_line(metas)}.",
        "This is an automatic wake-up, not a user message: work you started earlier in the "
        "background has ended. Each result below restates what was asked, so you can act on "
        "it even if you are in the middle of something else.",
        "",
    ]
    titles = [
        f"### Result {i} of {total} ({ident or 'no delivery id'})" for i, ident in enumerate(ids, 1)
    ]
    # A result's own text (a sub-agent's, a command's output) is defanged where it is
    # rendered (``_render_value``): it can neither pass for another result or wake-up nor
    # add a data line of its own.
    bodies = [_body(event, current, explain=False) for event in parsed]
    caps = _caps([len(b) for b in bodies], budget)
    out = list(head)
    for title, body, cap, ident in zip(titles, bodies, caps, ids, strict=True):
        out.append(title)
        out.append(_cut(body, cap, ident))
    out.extend(wake_data_line(meta) for meta in metas)
    return "\n".join(out) + "\n"


def _id_text(ident: str | None) -> str | None:
    return None if ident is None else render_value(ident)


# The key of a stored wake-up row's metadata that lists its results' ``display_metadata``.
WAKE_RESULTS_KEY = "results"
_COMBINED_COUNT = re.compile(re.escape(_COMBINED_HEAD) + r"(\d{1,6}) results arrived together")


def wake_results(text: str) -> list[JSONObject]:
    """The ``display_metadata`` of each result a wake-up text of this module carries, read
    only where ``format_wake_text``/``format_wake_batch`` put them: a single wake-up's last
    line, a combined one's last n lines (n from its head line). Nothing else in the text
    counts, whatever it holds; a text not written here gives []."""
    if not text.startswith(WAKE_MARKER):
        return []
    lines = text.rstrip("\n").split("\n")
    match = _COMBINED_COUNT.match(text)
    count = int(match.group(1)) if match else 1
    if count < 1 or count >= len(lines):
        return []
    tail = lines[-count:]
    if not all(line.startswith(f"{WAKE_DATA_MARKER} ") for line in tail):
        return []
    found = read_wake_data("\n".join(tail))
    return found if len(found) == count else []


def wake_row_metadata(text: str) -> JSONObject:
    """The ``display_metadata`` of the stored user row of a wake-up turn that ran ``text``
    (the server's own: only a turn the server marked as a wake-up calls this): the wake
    mark and its results' metadata, so that readers of the transcript (compaction, cards)
    take fields from the row, never from its text."""
    return {"wake": True, WAKE_RESULTS_KEY: [*wake_results(text)]}
