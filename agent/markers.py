"""Markers that tag machine-written messages, so models and front ends can tell them apart.

`gateway.wake.format_wake_text` puts WAKE_MARKER on the first line of every wake-up text and
ends it with one WAKE_DATA_MARKER line: the marker, a space, and the event's
``delivery.events.display_metadata`` as one line of JSON (``wake_data_line``), so readers
(the demo model, `reveille chat`) take fields instead of parsing the prose
(``read_wake_data``). Front ends that fold delivered results into a turn's context tag them
with DELIVERY_MARKER; sub-agent runs carry SUBAGENT_MARKER in their system message.
Compaction (``gateway.turns.compaction``) starts its summarisation calls' system message with
SUMMARISE_MARKER and every stored summary with SUMMARY_MARKER.

``defang`` is the one place that takes the meaning out of all of them (and out of the
headings that give a wake-up text or a summary its structure, ``STRUCTURE_HEADINGS``) in
text Reveille did not write: a sub-agent's result, a command's output, an MCP result, an
inbound event, a client's message, a model's summary. Every text that embeds such text calls
it; nothing reads structure back out of text that went through it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from agent.messages import JSONObject

WAKE_MARKER = "[reveille:wake]"
WAKE_DATA_MARKER = "[reveille:wake-data]"
DELIVERY_MARKER = "[reveille:delivery]"
SUBAGENT_MARKER = "[reveille:subagent]"
SUMMARISE_MARKER = "[reveille:summarise]"
SUMMARY_MARKER = "[reveille:summary]"


MARKERS = (
    WAKE_MARKER,
    WAKE_DATA_MARKER,
    DELIVERY_MARKER,
    SUBAGENT_MARKER,
    SUMMARISE_MARKER,
    SUMMARY_MARKER,
)
# What opens a line of structure in a wake-up text (``gateway.wake_text``: a result's head,
# a combined wake-up's result titles, a batch's task titles, a cut's pointer) or in a
# summary (``gateway.turns.compaction``: its list of finished work and its cut note).
STRUCTURE_HEADINGS = (
    "[Background ",
    "### Result ",
    "### Task ",
    "[... ",
    "Background work that already finished",
    "- earlier: ",
)
_WORD_JOINER = "\u2060"
_MARKER = re.compile(r"\[(?=reveille:)", re.IGNORECASE)
# A line starts after any line break ``str.splitlines`` knows, not only "\n".
_HEADING = re.compile(
    r"(?:^|(?<=[\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029]))([ \t]*)(?="
    + "|".join(re.escape(h) for h in STRUCTURE_HEADINGS)
    + ")",
    re.MULTILINE,
)


def defang(text: str) -> str:
    """Text Reveille did not write, as a model is given it: the markers above lose their
    meaning (a word joiner after the opening bracket, whatever the case) and so do the
    headings of ``STRUCTURE_HEADINGS`` at the start of a line (a word joiner before them),
    so no result, message or summary can pass anything off as a wake-up, a delivery, a data
    line, a sub-agent run, a summary or one of their parts. Idempotent; what is stored and
    shown stays as written."""
    if "[" in text:
        text = _MARKER.sub("[" + _WORD_JOINER, text)
    # A loop, not ``any()`` over a generator: every message of every turn is defanged.
    for heading in STRUCTURE_HEADINGS:
        if heading in text:
            return _HEADING.sub("\\1" + _WORD_JOINER, text)
    return text


def wake_data_line(metadata: Mapping[str, Any]) -> str:
    """The machine-readable line of a wake text (ASCII JSON: safe for any transport). Its
    values cannot carry a marker either (a reader that splits a text at ``WAKE_MARKER``
    would otherwise find a forged wake-up inside a preview): ``defang``'s word joiner, as a
    JSON escape."""
    data = json.dumps(dict(metadata), ensure_ascii=True, separators=(",", ":"), default=str)
    return f"{WAKE_DATA_MARKER} " + re.sub(
        r"\[(?=reveille:)", r"[\\u2060", data, flags=re.IGNORECASE
    )


def read_wake_data(text: str) -> list[JSONObject]:
    """The structured summaries of the WAKE_DATA_MARKER lines in ``text``, in order; lines
    that do not hold a JSON object are skipped."""
    found: list[JSONObject] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped.startswith(WAKE_DATA_MARKER):
            continue
        try:
            value = json.loads(stripped[len(WAKE_DATA_MARKER) :])
        except (ValueError, RecursionError):
            continue
        if isinstance(value, dict):
            found.append(value)
    return found
