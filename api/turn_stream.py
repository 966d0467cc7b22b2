"""A web UI turn as it runs and ends: the ``ActiveStream`` a tab can pick up after a reload,
a ``Revision`` (an edit or a regenerate of the last turn), how a tool step is shown, and what
is kept of a turn that was stopped or failed (its message, marked) and of its tool steps
(placed before its stored reply). ``api.web_turns.WebTurns`` starts and follows the turns.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

from agent.tools import ToolProgress
from api.attachments import ImageAttachment
from api.event_log import EventLog
from api.turn_answers import TurnRefused
from api.views import stored_images
from gateway.session import SessionStore
from gateway.turns.service import StartedTurn
from gateway.wake_text import wake_row_metadata

__all__ = [
    "ActiveStream",
    "Revision",
    "StreamView",
    "pin_tool_steps",
    "revise_last_turn",
    "store_failed",
    "store_stopped",
    "tool_step",
]

logger = logging.getLogger("api.web_turns")

REVISE_WINDOW = 50  # the newest messages the last turn is looked for in


@dataclass(frozen=True)
class Revision:
    """A turn that replaces the last one: its user message edited (the turn sends the new
    text) or answered again (``regenerated``: the turn sends the same message once more).
    ``message_id`` is the message the person saw as the last one (None: whichever is)."""

    how: Literal["edited", "regenerated"]
    message_id: int | None = None


class StreamView(TypedDict):
    """A running turn as a tab picks it up (``active_stream`` of ``GET /api/sessions/{id}``)."""

    stream_id: str
    turn_id: str
    text: str
    last_event_id: str
    user_text: str | None
    wakeup: bool
    images: int


@dataclass
class ActiveStream:
    """A running turn of a session: the reply so far and the id of its last event."""

    stream_id: str
    turn_id: str
    session_id: str
    user_text: str
    wakeup: bool
    text: str = ""
    # What is stored with the user's message (its images' thumbnails): also when it fails.
    user_metadata: dict[str, Any] = field(default_factory=dict)
    last_event_id: int = 0
    tool_steps: int = 0
    started: StartedTurn | None = field(default=None, repr=False)
    follower: asyncio.Task[None] | None = field(default=None, repr=False)
    holder: asyncio.Task[None] | None = field(default=None, repr=False)  # renews the lease
    # Resolved when the turn ends: whether it is in the transcript.
    stored: asyncio.Future[bool] | None = field(default=None, repr=False)

    def as_dict(self) -> StreamView:
        return {
            "stream_id": self.stream_id,
            "turn_id": self.turn_id,
            "text": self.text,
            "last_event_id": str(self.last_event_id),
            # A reload mid-turn shows the running turn's question (the stored items hold
            # finished turns only); a wake-up turn has no user question to show.
            "user_text": None if self.wakeup else self.user_text,
            "wakeup": self.wakeup,
            # How many images the question carries: a tab shows them from the stored
            # transcript once the turn ends (never sent through the event log).
            "images": len(self.user_metadata.get("images") or ()),
        }


def tool_step(step: ToolProgress) -> dict[str, str]:
    status = "started" if step.phase == "started" else ("done" if step.ok else "failed")
    took = f" in {step.seconds:g} s" if step.phase != "started" else ""
    return {"name": step.name, "status": status, "summary": f"{step.name} {status}{took}"}


async def pin_tool_steps(
    store: SessionStore, log: EventLog, stream: ActiveStream, *, stored: bool
) -> None:
    """Show the turn's tool steps before its stored reply (the newest assistant message
    now); a turn that stored nothing leaves no steps behind."""
    try:
        reply_id: int | None = None
        if stored:
            rows = await asyncio.to_thread(store.messages, stream.session_id)
            reply_id = next((m.id for m in reversed(rows) if m.role == "assistant"), None)
        await log.place_tool_steps(stream.turn_id, reply_id)
    except Exception:
        logger.exception("could not place the tool steps of %s", stream.turn_id)


async def store_stopped(store: SessionStore, stream: ActiveStream) -> bool:
    """Keep a stopped turn: the user's message and the reply so far, marked stopped."""
    user: dict[str, Any] = {"role": "user", "content": stream.user_text}
    if stream.user_metadata:
        user["display_metadata"] = dict(stream.user_metadata)
    if stream.wakeup:
        user["display_metadata"] = wake_row_metadata(stream.user_text)
    reply = {"role": "assistant", "content": stream.text, "display_metadata": {"stopped": True}}
    try:
        await store.aappend_turn(stream.session_id, [user, reply])
    except Exception:
        logger.exception("could not store the stopped turn %s", stream.turn_id)
        return False
    return True


async def store_failed(store: SessionStore, stream: ActiveStream, error: str) -> None:
    """A user's turn failed: keep their message in the transcript, marked failed with
    the error, so that a reload still shows it (and its Retry). The model never sees a
    failed message as history (``gateway.turns.conversation.build_context``): a retry sends
    the text again, and the view shows a failed message followed by its retry once."""
    meta = {**stream.user_metadata, "failed": True, "error": error[:500]}
    user = {"role": "user", "content": stream.user_text, "display_metadata": meta}
    try:
        await store.aappend_turn(stream.session_id, [user])
    except Exception:
        logger.exception("could not store the failed turn %s", stream.turn_id)


async def revise_last_turn(
    store: SessionStore,
    session_id: str,
    revise: Revision,
    text: str,
    images: tuple[ImageAttachment, ...],
) -> tuple[str, tuple[ImageAttachment, ...]] | TurnRefused:
    """Under the session's lease: mark the last turn (the person's message and the replies
    after it) superseded; the new turn's text and images (a regeneration's are the last
    message's own; an edit keeps the images unless it sends others)."""
    rows = await asyncio.to_thread(store.latest_messages, session_id, limit=REVISE_WINDOW)
    people = [
        i
        for i, row in enumerate(rows)
        if row.role == "user"
        and not row.is_delivery
        and not (row.display_metadata or {}).get("superseded")
    ]
    if not people:
        return TurnRefused(409, "there is no message to edit or answer again", "no_message")
    last = people[-1]
    target = rows[last]
    if (target.display_metadata or {}).get("wake") or (
        revise.message_id is not None and revise.message_id != target.id
    ):
        return TurnRefused(
            409, "only the last message can be edited or answered again", "not_last_message"
        )
    replies = [r.id for r in rows[last + 1 :] if r.role == "assistant" and not r.is_delivery]
    await store.asupersede(session_id, [target.id, *replies], revise.how)
    kept = tuple(
        ImageAttachment(i["name"], i["url"]) for i in stored_images(target.display_metadata or {})
    )
    if revise.how == "regenerated":
        return target.content, kept
    return text, images or kept
