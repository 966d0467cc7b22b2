"""Reads wake-up and delivered-result texts back into one-line summaries (for the demo model).

The texts (see `gateway.wake.format_wake_text`) are written for language models, not for
parsing, so this reads them leniently: `Label: value` lines with a known label become
fields; a label alone on its line opens a block that runs until the next known label (an
output block runs to the end, since program output is arbitrary text); a
"### Task i of n: status" heading starts the next task of a batch; a text with no
recognisable field at all is summarised by its first lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

from agent.markers import DELIVERY_MARKER, WAKE_MARKER

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


def summarise_completion_text(text: str) -> list[str]:
    """One summary line per completion found in a wake-up or delivery text."""
    pattern = f"{re.escape(WAKE_MARKER)}|{re.escape(DELIVERY_MARKER)}"
    segments = [s for s in re.split(pattern, text)[1:] if s.strip()]
    notices: list[CompletionNotice] = []
    for segment in segments:
        reader = _SegmentReader()
        for line in segment.splitlines():
            reader.feed(line)
        notices.extend(reader.finished())
    if not notices and segments:
        # Nothing recognisable: still tell the user something finished, in its own words.
        fallback = CompletionNotice(summary=first_lines(segments[0], _OUTPUT_LINES))
        notices.append(fallback)
    return [notice.one_line() for notice in notices]


def is_completion_text(text: str) -> bool:
    return WAKE_MARKER in text or DELIVERY_MARKER in text
