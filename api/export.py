"""A conversation as a file to download: Markdown to read, JSON to keep or process.

``GET /api/sessions/{id}/export?format=md|json`` (``api.server``) answers with one of these
as an attachment. Both hold the whole transcript in order, archived rows included (they are
what was said), with each message's role, time and kind; the JSON keeps every stored field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from api.views import DELIVERY_TITLES, session_source
from gateway.session import MessageRecord, SessionRecord

__all__ = ["FORMATS", "export_filename", "export_json", "export_markdown"]

FORMATS = {"md": "text/markdown", "json": "application/json"}
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def export_filename(record: SessionRecord, fmt: str) -> str:
    """A name safe in a header and on any disk: the title's letters and digits, or the id."""
    stem = _UNSAFE.sub("-", record.title or "").strip("-.")[:60] or record.id
    return f"{stem}.{fmt}"


def _heading(message: MessageRecord) -> str:
    if message.display_kind:
        kind = message.display_kind
        return DELIVERY_TITLES.get(kind) or kind.replace("_", " ").capitalize()
    return {"user": "User", "assistant": "Assistant", "system": "System"}.get(
        message.role, message.role.capitalize()
    )


def export_markdown(record: SessionRecord, messages: Sequence[MessageRecord]) -> str:
    """The transcript as Markdown: a section per message, its text as it was written."""
    title = " ".join((record.title or "Untitled chat").split())
    lines = [
        f"# {title}",
        "",
        f"- Session: `{record.id}`",
        f"- Source: {session_source(record)}",
        f"- Created: {_when(record.created_at)}",
        f"- Exported: {_when(datetime.now(UTC).timestamp())}",
        "",
    ]
    for message in messages:
        notes = []
        meta = message.display_metadata or {}
        if message.archived:
            notes.append("summarised for the model")
        if meta.get("failed"):
            notes.append("not answered")
        if meta.get("superseded"):
            notes.append(str(meta["superseded"]))
        note = f" ({', '.join(notes)})" if notes else ""
        lines += [f"## {_heading(message)} · {_when(message.created_at)}{note}", ""]
        lines += [message.content.rstrip() or "_(empty)_", ""]
    return "\n".join(lines)


def export_json(record: SessionRecord, messages: Sequence[MessageRecord]) -> str:
    """The session and every stored field of each message, as one JSON document."""
    data: dict[str, Any] = {
        "format": "reveille.conversation.v1",
        "session": {**record.as_dict(), "source_platform": session_source(record)},
        "messages": [message.as_dict() for message in messages],
    }
    return json.dumps(data, ensure_ascii=False, indent=2)
