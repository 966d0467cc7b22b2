"""Markers that tag machine-written messages, so models and front ends can tell them apart.

`gateway.wake.format_wake_text` puts WAKE_MARKER on the first line of every wake-up text and
ends it with one WAKE_DATA_MARKER line: the marker, a space, and the event's
``delivery.events.display_metadata`` as one line of JSON (``wake_data_line``), so readers
(the demo model, `reveille chat`) take fields instead of parsing the prose
(``read_wake_data``). Front ends that fold delivered results into a turn's context tag them
with DELIVERY_MARKER; sub-agent runs carry SUBAGENT_MARKER in their system message.
Compaction (``gateway.compaction``) starts its summarisation calls' system message with
SUMMARISE_MARKER and every stored summary with SUMMARY_MARKER.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

WAKE_MARKER = "[reveille:wake]"
WAKE_DATA_MARKER = "[reveille:wake-data]"
DELIVERY_MARKER = "[reveille:delivery]"
SUBAGENT_MARKER = "[reveille:subagent]"
SUMMARISE_MARKER = "[reveille:summarise]"
SUMMARY_MARKER = "[reveille:summary]"


def defang(text: str) -> str:
    """Text a person wrote, as the model is given it: the markers above lose their meaning
    (a word joiner after the opening bracket), so no user can pass a message off as a
    wake-up, a delivery or a sub-agent run. What is stored and shown stays as written."""
    if "[reveille:" not in text:
        return text
    return text.replace("[reveille:", "[\u2060reveille:")


def wake_data_line(metadata: Mapping[str, Any]) -> str:
    """The machine-readable line of a wake text (ASCII JSON: safe for any transport)."""
    return f"{WAKE_DATA_MARKER} " + json.dumps(
        dict(metadata), ensure_ascii=True, separators=(",", ":"), default=str
    )


def read_wake_data(text: str) -> list[dict[str, Any]]:
    """The structured summaries of the WAKE_DATA_MARKER lines in ``text``, in order; lines
    that do not hold a JSON object are skipped."""
    found: list[dict[str, Any]] = []
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
