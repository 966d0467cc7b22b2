"""Wake-up and delivered-result texts as one-line summaries (demo model, `reveille chat`).

Texts Reveille writes (`gateway.wake_text.format_wake_text`) end with an
``agent.markers.WAKE_DATA_MARKER`` line holding the event's ``display_metadata`` as JSON;
those are summarised from that data alone (``summarise_metadata``), never from the prose.

Texts without it (written by hand, by older versions or by other tools) are read leniently:
`Label: value` lines with a known label become fields; a label alone on its line opens a
block that runs until the next known label (an output block runs to the end, since program
output is arbitrary text); a "### Task i of n: status" heading starts the next task of a
batch; a text with no recognisable field at all is summarised by its first lines.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from agent.markers import DELIVERY_MARKER, WAKE_DATA_MARKER, WAKE_MARKER, read_wake_data

_LABELS = {
    "goal": "goal",
    "task": "goal",
    "command": "command",
    "cmd": "command",
    "status": "status",
    "state": "status",
    "outcome": "status",
    "exit code": "exit_code",
    "exit_code": "exit_code",
    "exit status": "exit_code",
    "return code": "exit_code",
    "returncode": "exit_code",
    "summary": "summary",
    "result": "summary",
    "error": "error",
    "output": "output",
    "output (tail)": "output",
    "stdout": "output",
    "last output": "output",
    "output tail": "output",
}

# "Goal: x", "- **Status:** done", "## Result: y" — decoration around the label is ignored.
_LABEL_LINE = re.compile(
    r"^[\s>*_`#-]*(?P<label>[A-Za-z][A-Za-z _()-]{0,29}?)[\s*_`]*:(?P<value>.*)$"
)
_TASK_HEADING = re.compile(r"^\s*#+\s*Task\s+\d+\s+of\s+\d+\s*:\s*(?P<status>[\w-]+)", re.I)
_MAX_RESULT_CHARS = 400
_OUTPUT_LINES = 3


@dataclass
class CompletionNotice:
    """What one finished piece of background work reported."""

    goal: str = ""
    command: str = ""
    status: str = ""
    exit_code: str = ""
    summary: str = ""
    error: str = ""
    output: str = ""

    def has_substance(self) -> bool:
        return any((self.goal, self.command, self.summary, self.error, self.output))

    def one_line(self) -> str:
        subject = self.goal or (f"`{self.command}`" if self.command else "background task")
        status = self.status or (f"exit code {self.exit_code}" if self.exit_code else "finished")
        if self.status and self.exit_code and self.exit_code not in self.status:
            status = f"{status} (exit code {self.exit_code})"
        result = (
            _collapse(self.summary)
            or _collapse(self.error)
            or first_lines(self.output, _OUTPUT_LINES)
            or "(no result text)"
        )
        return f"Background work finished: {subject}: {status}. Result: {result}"


def _collapse(text: str) -> str:
    text = " ".join(text.split())
    if len(text) > _MAX_RESULT_CHARS:
        return text[: _MAX_RESULT_CHARS - 1] + "…"
    return text


def _clean(value: str) -> str:
    return value.strip(" \t*_`")


def first_lines(text: str, count: int) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip().strip("`")]
    return _collapse(" | ".join(lines[:count]))


class _SegmentReader:
    """Walks the lines of one wake-up or delivery text, filling notices as it goes."""

    def __init__(self) -> None:
        self.notices = [CompletionNotice()]
        self.field: str | None = None
        # A block (label alone on its line) holds free text, so only a known label ends it.
        self.block = False
        self.in_fence = False

    @property
    def current(self) -> CompletionNotice:
        return self.notices[-1]

    def _append(self, line: str) -> None:
        if self.field is not None:
            setattr(self.current, self.field, f"{getattr(self.current, self.field)}\n{line}")

    def feed(self, line: str) -> None:
        if line.strip().startswith("```"):
            self.in_fence = not self.in_fence
        if self.in_fence or (self.field == "output" and self.block):
            # Program output is arbitrary text: its "error: ..." lines are not labels. An
            # output block runs to the end, as it does in the gateway's wake-up texts.
            self._append(line)
            return
        heading = _TASK_HEADING.match(line)
        if heading:
            self.notices.append(CompletionNotice(status=heading["status"]))
            self.field, self.block = None, False
            return
        match = _LABEL_LINE.match(line)
        label = _LABELS.get(match["label"].strip().lower()) if match else None
        if match is None or label is None:
            if match is not None and not self.block:
                # An unknown "Label:" line ends an inline field.
                self.field = None
            else:
                self._append(line)
            return
        if label == "goal" and self.current.goal:
            self.notices.append(CompletionNotice())
        value = _clean(match["value"])
        self.field = label
        self.block = not value
        setattr(self.current, label, value)

    def finished(self) -> list[CompletionNotice]:
        for notice in self.notices:
            for name in ("goal", "command", "status", "exit_code"):
                setattr(notice, name, _collapse(getattr(notice, name)))
            for item in fields(notice):
                setattr(notice, item.name, getattr(notice, item.name).strip())
        return [notice for notice in self.notices if notice.has_substance()]


def _s(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return ""
    return value if isinstance(value, str) else str(value)


def _metadata_notices(meta: Mapping[str, Any]) -> list[CompletionNotice]:
    kind = meta.get("work_kind") if meta.get("kind") == "abandoned" else meta.get("kind")
    if kind == "process":
        # Processes are told by their exit code (the status only says completed/failed).
        code = meta.get("exit_code")
        return [
            CompletionNotice(
                command=_s(meta.get("command")),
                exit_code="unknown" if code is None else _s(code),
                error=_s(meta.get("error")),
                output=_s(meta.get("output_tail")),
            )
        ]
    if kind == "delegation_batch":
        items = [r for r in meta.get("results") or [] if isinstance(r, Mapping)]
        if items:
            return [
                CompletionNotice(
                    goal=_s(r.get("goal")),
                    status=_s(r.get("status")) or "unknown",
                    summary=_s(r.get("summary")) or _s(r.get("result")),
                    error=_s(r.get("error")),
                )
                for r in items
            ]
        goals = meta.get("goals") or []
        goal = "; ".join(_s(g) for g in goals) if isinstance(goals, list) else ""
        return [_single_notice(meta, goal)]
    if kind == "delegation":
        return [_single_notice(meta, _s(meta.get("goal")))]
    return []


def _single_notice(meta: Mapping[str, Any], goal: str) -> CompletionNotice:
    summary = _s(meta.get("summary"))
    error = _s(meta.get("error"))
    return CompletionNotice(
        goal=goal,
        status=_s(meta.get("status")),
        summary=summary or ("" if error else _s(meta.get("result"))),
        error=error,
    )


def summarise_metadata(meta: Mapping[str, Any]) -> list[str]:
    """One summary line per completion described by a ``display_metadata`` dict; [] when it
    describes no kind this knows (a generic event)."""
    if meta.get("kind") == "scheduled_wakeup":
        # A reminder the demo set (``remind me in N seconds: <text>``): restate its text.
        note = _s(meta.get("note")) or "(no note)"
        if meta.get("status") == "missed":  # a schedule's occurrence its policy skipped
            return [f"Missed (not run): {note}"]
        return [f"Reminder: {note}"]
    notices = [n for n in _metadata_notices(meta) if n.has_substance() or n.status]
    return [notice.one_line() for notice in notices]


def _prose_notices(segment: str) -> list[CompletionNotice]:
    reader = _SegmentReader()
    for line in segment.splitlines():
        if not line.strip().startswith(WAKE_DATA_MARKER):
            reader.feed(line)
    return reader.finished()


def summarise_completion_text(text: str) -> list[str]:
    """One summary line per completion found in a wake-up or delivery text."""
    pattern = f"{re.escape(WAKE_MARKER)}|{re.escape(DELIVERY_MARKER)}"
    segments = [s for s in re.split(pattern, text)[1:] if s.strip()]
    lines: list[str] = []
    for segment in segments:
        structured = [line for meta in read_wake_data(segment) for line in summarise_metadata(meta)]
        lines.extend(structured or [n.one_line() for n in _prose_notices(segment)])
    if not lines and segments:
        # Nothing recognisable: still tell the user something finished, in its own words.
        body = "\n".join(
            line
            for line in segments[0].splitlines()
            if not line.strip().startswith(WAKE_DATA_MARKER)
        )
        lines.append(CompletionNotice(summary=first_lines(body, _OUTPUT_LINES)).one_line())
    return lines


def is_completion_text(text: str) -> bool:
    return WAKE_MARKER in text or DELIVERY_MARKER in text
