"""Wake-up texts: a completion event rendered as the self-contained message that re-enters
its conversation.

When a wake-up arrives the agent may be deep in other work, so the text restates the goal,
the context, when the work was dispatched and the full result (SPEC.md, "Completion
events"). The first line opens with ``WAKE_MARKER`` so that models and front ends can tell
a wake-up from something the user typed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from agent.markers import WAKE_MARKER

__all__ = [
    "delegation_counts",
    "delegation_goals",
    "format_wake_text",
    "is_batch",
    "is_present",
]

_SUCCESS_STATUSES = frozenset({"completed", "success", "succeeded", "ok", "done"})
_ABNORMAL_STATUSES = frozenset({"interrupted", "unknown", "stalled", "cancelled", "error"})



def _parse_time(value: Any) -> datetime | None:
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


def _iso(dt: datetime) -> str:
    return dt.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _human_duration(value: Any) -> str:
    if isinstance(value, bool):
        return str(value)
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return str(value)
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


def _when(value: Any, now: float) -> str:
    dt = _parse_time(value)
    if dt is None:
        return str(value)
    ago = now - dt.timestamp()
    if ago < 0:
        return f"{_iso(dt)} (in the future by {_human_duration(-ago)}; clock skew?)"
    if ago < 1:
        return f"{_iso(dt)} (just now)"
    return f"{_iso(dt)} ({_human_duration(ago)} ago)"


def _field(label: str, value: Any) -> str:
    text = value if isinstance(value, str) else _render_value(value)
    # Multi-line values go below their label so the text stays readable.
    return f"{label}:\n{text}" if "\n" in text else f"{label}: {text}"


def _render_value(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping | list | tuple):
        return json.dumps(value, indent=2, ensure_ascii=False, default=str)
    return str(value)


def is_present(value: Any) -> bool:
    return value is not None and value != "" and value != [] and value != {}


def is_batch(evt: Mapping[str, Any]) -> bool:
    return bool(evt.get("is_batch")) or isinstance(evt.get("results"), list)


def _is_success(status: Any) -> bool:
    return isinstance(status, str) and status.strip().lower() in _SUCCESS_STATUSES


def delegation_goals(evt: Mapping[str, Any]) -> list[str]:
    goals = evt.get("goals")
    if isinstance(goals, list | tuple):
        return [str(g) for g in goals]
    goal = evt.get("goal")
    return [str(goal)] if is_present(goal) else []


def delegation_counts(evt: Mapping[str, Any]) -> dict[str, int]:
    """``{"tasks", "completed", "failed"}`` for a delegation event.

    A single delegation is one task. For a batch, tasks come from ``results[]`` (or the
    goals when results are missing); anything that did not complete counts as failed.
    """
    if is_batch(evt):
        results = evt.get("results")
        results = results if isinstance(results, list) else []
        tasks = len(results) or len(delegation_goals(evt))
        completed = sum(
            1 for r in results if isinstance(r, Mapping) and _is_success(r.get("status"))
        )
    else:
        tasks = 1
        completed = 1 if _is_success(evt.get("status")) else 0
    return {"tasks": tasks, "completed": completed, "failed": tasks - completed}


def _outcome_lines(item: Mapping[str, Any]) -> list[str]:
    lines: list[str] = []
    summary, error = item.get("summary"), item.get("error")
    if is_present(summary):
        lines.append("Result:\n" + _render_value(summary))
    if is_present(error):
        lines.append("Error:\n" + _render_value(error))
    if not lines:
        extra = item.get("result")
        if is_present(extra):
            lines.append("Result:\n" + _render_value(extra))
        else:
            lines.append("Result: (no summary or error was returned)")
    return lines


def _common_delegation_lines(evt: Mapping[str, Any], now: float) -> list[str]:
    lines: list[str] = []
    if is_present(evt.get("context")):
        lines.append(_field("Context", evt["context"]))
    for key, label in (("role", "Role"), ("model", "Model")):
        if is_present(evt.get(key)):
            lines.append(_field(label, evt[key]))
    toolsets = evt.get("toolsets")
    if is_present(toolsets):
        joined = ", ".join(map(str, toolsets)) if isinstance(toolsets, list | tuple) else toolsets
        lines.append(_field("Toolsets", joined))
    if is_present(evt.get("dispatched_at")):
        lines.append("Dispatched: " + _when(evt["dispatched_at"], now))
    if is_present(evt.get("completed_at")):
        lines.append("Completed: " + _when(evt["completed_at"], now))
    return lines


def _format_delegation(evt: Mapping[str, Any], now: float) -> str:
    delegation_id = evt.get("delegation_id") or "(unknown id)"
    status = evt.get("status")
    batch = is_batch(evt)
    counts = delegation_counts(evt)
    goals = delegation_goals(evt)
    out: list[str] = []

    if batch:
        out.append(
            f"[Background delegation batch finished] {delegation_id}: {counts['tasks']} "
            f"task(s), {counts['completed']} completed, {counts['failed']} failed."
        )
    else:
        out.append(
            f"[Background delegation finished] {delegation_id}: status {status or 'unknown'}."
        )
    out.append(
        "This is an automatic wake-up, not a user message: work you delegated earlier has "
        "ended. It restates what was asked so you can act on it even if you are in the "
        "middle of something else."
    )
    if evt.get("_restored"):
        # Set by the ledger on events it offers again (restart or orphan re-offer).
        out.append("(Re-delivered after a restart or an interrupted delivery.)")
    out.append("")

    if batch:
        out.append("Goals:")
        out.extend(f"  {i}. {goal}" for i, goal in enumerate(goals, 1))
    elif goals:
        out.append(_field("Goal", goals[0]))
    out.extend(_common_delegation_lines(evt, now))
    duration = evt.get("total_duration_seconds") if batch else None
    if duration is None:
        duration = evt.get("duration_seconds")
    if duration is not None:
        out.append(("Total duration: " if batch else "Duration: ") + _human_duration(duration))
    if is_present(status):
        out.append(f"Status: {status}")
    if isinstance(status, str) and status.lower() in _ABNORMAL_STATUSES:
        out.append(
            f"Note: the work did not finish normally ({status}); what is known is reported below."
        )
    out.append("")

    if batch:
        raw_results = evt.get("results")
        results: list[Any] = raw_results if isinstance(raw_results, list) else []
        out.append("Results:")
        total = len(results)
        for i, result in enumerate(results):
            out.append("")
            if not isinstance(result, Mapping):
                out.append(f"### Task {i + 1} of {total}")
                out.append(_render_value(result))
                continue
            head = f"### Task {i + 1} of {total}: {result.get('status') or 'unknown'}"
            if result.get("duration_seconds") is not None:
                head += f" ({_human_duration(result['duration_seconds'])})"
            out.append(head)
            goal = result.get("goal") or (goals[i] if i < len(goals) else None)
            if is_present(goal):
                out.append(_field("Goal", goal))
            out.extend(_outcome_lines(result))
        if not results:
            out.append("(no per-task results were recorded)")
            out.extend(_outcome_lines(evt))
    else:
        out.extend(_outcome_lines(evt))
    return "\n".join(out).rstrip() + "\n"


def _first_present(evt: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        if is_present(evt.get(key)):
            return evt[key]
    return None


def _format_process_completion(evt: Mapping[str, Any], now: float) -> str:
    exit_code = _first_present(evt, "exit_code", "returncode", "return_code")
    command = _first_present(evt, "command", "cmd")
    proc_id = _first_present(evt, "process_id", "proc_id", "session_id", "pid")
    duration = _first_present(evt, "duration_seconds", "duration")
    output = _first_present(evt, "output", "output_tail", "tail", "stdout")
    code_text = "unknown" if exit_code is None else str(exit_code)

    out = [
        f"[Background process finished] exit code {code_text}.",
        "This is an automatic wake-up, not a user message: a background command you started "
        "earlier has exited.",
    ]
    if evt.get("_restored"):
        out.append("(Re-delivered after a restart or an interrupted delivery.)")
    out.append("")
    if command is not None:
        out.append(_field("Command", _render_value(command)))
    if proc_id is not None:
        out.append(f"Process: {proc_id}")
    if is_present(evt.get("cwd")):
        out.append(f"Working directory: {evt['cwd']}")
    if is_present(evt.get("started_at")):
        out.append("Started: " + _when(evt["started_at"], now))
    out.append(f"Exit code: {code_text}")
    if duration is not None:
        out.append("Duration: " + _human_duration(duration))
    out.append("")
    if output is not None:
        out.append("Output (tail):")
        out.append(_render_value(output))
    else:
        out.append("Output: (none captured)")
    return "\n".join(out).rstrip() + "\n"


def _format_generic(evt: Mapping[str, Any]) -> str:
    out = [
        f"[Background event: {evt.get('type') or 'unknown'}]",
        "This is an automatic wake-up, not a user message.",
    ]
    if evt.get("_restored"):
        out.append("(Re-delivered after a restart or an interrupted delivery.)")
    out.append("")
    for key, value in evt.items():
        # "_"-prefixed keys are the ledger's bookkeeping (re-offer marks), not event data.
        if key == "type" or str(key).startswith("_") or value is None:
            continue
        out.append(_field(str(key), value))
    return "\n".join(out).rstrip() + "\n"


def format_wake_text(evt: Mapping[str, Any], *, now: float | None = None) -> str:
    """Self-contained wake-up text for a completion event; results are never truncated.

    The first line starts with ``agent.markers.WAKE_MARKER``.
    ``now`` (epoch seconds) pins the "how long ago" arithmetic for reproducible output.
    """
    current = time.time() if now is None else now
    kind = evt.get("type")
    if kind == "async_delegation":
        text = _format_delegation(evt, current)
    elif kind == "completion":
        text = _format_process_completion(evt, current)
    else:
        text = _format_generic(evt)
    # The marker opens the first line, so models and front ends can tell a wake-up from
    # something the user typed.
    return f"{WAKE_MARKER} {text}"
