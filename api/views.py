"""What the browser is sent: session-store records and ledger rows in the protocol's shapes.

``docs/webui-protocol.md`` names them: ``Session``, the transcript's ``Item``s (messages,
wake-up cards, tool steps), ``WakeupCard`` and ``Delivery``. A wake-up turn is stored as a
user message marked ``wake`` by the server that ran it (its text opens with ``WAKE_MARKER``
and ends with the completion's summary, ``WAKE_DATA_MARKER``); it is shown as its card, and
the reply after it is marked as the wake-up's. Text that only looks like one is a message.
A user's message whose turn failed (marked ``failed`` by ``api.web_turns``) carries its
error, until the same text is sent again: then its retry stands in its place.
Every string is passed as data; the browser shows it as text.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from agent.markers import read_wake_data
from agent.messages import JSONObject
from api.event_log import ToolStep
from delivery.cancel import Progress
from delivery.rows import LedgerRow
from delivery.session_backend import SNIPPET_END, SNIPPET_START, MessageHit
from gateway.approvals import EXPIRED_DISPLAY_KIND
from gateway.config import Platform
from gateway.session import MessageRecord, SessionRecord, title_from_text
from gateway.wake_text import is_combined_wake, wake_batch_key

__all__ = [
    "WakeupCard",
    "background_view",
    "card_from_metadata",
    "card_of_wake_text",
    "combined_card",
    "delivery_item",
    "delivery_view",
    "search_view",
    "session_source",
    "session_view",
    "stored_images",
    "title_from_text",
    "transcript_items",
]

_DEFAULT_TITLE = "New chat"
_IMAGE_URL = re.compile(r"data:image/(png|jpeg|gif|webp);base64,")


@dataclass(frozen=True)
class WakeupCard:
    """A completion as the compact card of the transcript shows it. A combined wake-up
    (several results in one turn) is ``work_kind="combined"`` with one card per result in
    ``results``; its ``delivery_id`` is the batch's key (``wake_batch_key``)."""

    delivery_id: str
    work_kind: str
    goal: str
    status: str
    result: str
    duration_seconds: float | None
    command: str | None
    exit_code: int | None
    results: tuple[WakeupCard, ...] = ()

    def as_dict(self) -> JSONObject:
        out = asdict(self)
        out["results"] = [card.as_dict() for card in self.results]
        return out


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def card_from_metadata(meta: Mapping[str, Any]) -> WakeupCard:
    """The card of a completion's ``display_metadata`` (``delivery.event_display``)."""
    work_kind = "process" if meta.get("kind") == "process" or meta.get("command") else "delegation"
    if meta.get("kind") == "scheduled_wakeup":
        work_kind = "scheduled_wakeup"  # a wake-up the agent set: its note is the goal
    goals = meta.get("goals")
    goal = _text(meta.get("goal"))
    if not goal and isinstance(goals, list):
        goal = "; ".join(_text(g) for g in goals)
    result = ""
    for name in ("summary", "result", "error", "output_tail"):
        if meta.get(name):
            result = _text(meta[name])
            break
    results = meta.get("results")
    if not result and isinstance(results, list):
        result = "\n".join(
            _text(r.get("summary") or r.get("error") or r.get("result"))
            for r in results
            if isinstance(r, Mapping)
        )
    if work_kind == "scheduled_wakeup" and not result:
        result = _came_due(meta)
    exit_code = _number(meta.get("exit_code"))
    return WakeupCard(
        delivery_id=_text(meta.get("delegation_id") or meta.get("delivery_id")),
        work_kind=work_kind,
        goal=goal or _text(meta.get("command")) or _text(meta.get("note")),
        status=_text(meta.get("status")) or "unknown",
        result=result,
        duration_seconds=_number(meta.get("duration_seconds")),
        command=_text(meta["command"]) if meta.get("command") else None,
        exit_code=int(exit_code) if exit_code is not None else None,
    )


def _came_due(meta: Mapping[str, Any]) -> str:
    """What a wake-up the agent set says instead of a result: when it came due."""
    due = _number(meta.get("due_at"))
    if due is None:
        return ""
    when = datetime.fromtimestamp(due, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    zone = _text(meta.get("zone"))
    return f"Came due at {when}" + (f" ({zone})" if zone and zone != "UTC" else "")


_COMBINED_GOAL_CHARS = 300


def combined_card(cards: Sequence[WakeupCard]) -> WakeupCard:
    """The card of one wake-up that carried several results: a line per result's goal,
    one status when they agree (else ``mixed``), the longest duration."""
    statuses = {card.status for card in cards}
    goal = "; ".join(card.goal for card in cards if card.goal)
    if len(goal) > _COMBINED_GOAL_CHARS:
        goal = goal[: _COMBINED_GOAL_CHARS - 1] + "\u2026"
    durations = [c.duration_seconds for c in cards if c.duration_seconds is not None]
    return WakeupCard(
        delivery_id=wake_batch_key([card.delivery_id for card in cards]),
        work_kind="combined",
        goal=f"{len(cards)} results: {goal}" if goal else f"{len(cards)} results",
        status=statuses.pop() if len(statuses) == 1 else "mixed",
        result="",
        duration_seconds=max(durations) if durations else None,
        command=None,
        exit_code=None,
        results=tuple(cards),
    )


def card_of_wake_text(text: str) -> WakeupCard | None:
    """The card of a wake-up text, from its machine-readable lines (one per result: a
    combined wake-up's card lists each); None if it has none."""
    found = read_wake_data(text)
    if len(found) > 1 and is_combined_wake(text):
        return combined_card([card_from_metadata(meta) for meta in found])
    return card_from_metadata(found[-1]) if found else None


def session_source(record: SessionRecord) -> str:
    source = record.source
    if isinstance(source, Mapping) and source.get("platform"):
        return str(source["platform"])
    return Platform.API_SERVER.value


def session_view(record: SessionRecord, *, unread: bool, busy: bool) -> JSONObject:
    source = session_source(record)
    return {
        "id": record.id,
        "title": record.title or _DEFAULT_TITLE,
        "source": source,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
        "unread": unread,
        "busy": busy,
        "chat": source == Platform.WEBUI.value,
        "system_prompt": record.system_prompt or "",
    }


def snippet_parts(snippet: str) -> list[JSONObject]:
    """A search snippet as pieces of text, ``hit`` for the matched words: the browser shows
    each as text (the marks never reach it)."""
    first, *rest = snippet.split(SNIPPET_START)
    pieces: list[tuple[str, bool]] = [(first, False)]
    for piece in rest:
        hit, _, after = piece.partition(SNIPPET_END)
        pieces += [(hit, True), (after, False)]
    return [{"text": text.replace(SNIPPET_END, ""), "hit": hit} for text, hit in pieces if text]


def search_view(hit: MessageHit, record: SessionRecord) -> JSONObject:
    """A message a search found, with its session's title and source to show beside it."""
    return {
        "session_id": hit.session_id,
        "session_title": record.title or _DEFAULT_TITLE,
        "source": session_source(record),
        "message_id": f"m{hit.message_id}",
        "role": hit.role,
        "created_at": hit.created_at,
        "snippet": [*snippet_parts(hit.snippet)],
    }


def _tool_item(step: ToolStep) -> JSONObject:
    return {
        "kind": "tool",
        "id": f"t{step.id}",
        "name": step.name,
        "status": step.status,
        "summary": step.summary,
    }


def _expired_approval(meta: Mapping[str, Any]) -> JSONObject:
    return {
        "id": _text(meta.get("approval_id")),
        "command": _text(meta.get("command")),
        "unit_id": _text(meta.get("unit_id")),
        "status": "expired",
    }


def transcript_items(
    messages: Iterable[MessageRecord],
    tool_steps: Sequence[ToolStep] = (),
    live_streams: Collection[str] = (),
) -> list[JSONObject]:
    """A stored transcript as the protocol's items, in order. A turn's tool steps go right
    before its reply; steps of the turn running now come last. A user's message kept before
    its turn ran (``pending``: its stream) is hidden while that stream is live (the running
    turn shows it) and once what the turn stored stands in its place; otherwise its server
    died before answering, and it shows failed."""
    items: list[JSONObject] = []
    after_wake = False
    pinned: dict[int, list[ToolStep]] = {}
    running: list[ToolStep] = []
    for step in tool_steps:
        if step.message_id is None:
            running.append(step)
        else:
            pinned.setdefault(step.message_id, []).append(step)
    rows = list(messages)
    for index, row in enumerate(rows):
        row_id = f"m{row.id}"
        content = row.content
        meta = row.display_metadata or {}
        items.extend(_tool_item(step) for step in pinned.get(row.id, ()))
        summary = meta.get("summary") if row.role == "system" and not row.is_delivery else None
        if isinstance(summary, Mapping):
            # A compaction's summary (gateway.turns.compaction): a marker where it happened; the
            # messages it replaced for the model are still shown, marked archived.
            deliveries = summary.get("deliveries") or []
            items.append(
                {
                    "kind": "summary",
                    "id": row_id,
                    "messages": int(summary.get("messages") or 0),
                    "deliveries": [
                        _text(d.get("id")) for d in deliveries if isinstance(d, Mapping)
                    ],
                    "archived": row.archived,
                }
            )
            continue
        if row.is_delivery and row.display_kind == EXPIRED_DISPLAY_KIND:
            # A background task's approval nobody answered: its card, settled expired.
            items.append({"kind": "approval", "id": row_id, "approval": _expired_approval(meta)})
            continue
        if row.is_delivery:
            # A delivery row (API-server sessions), drawn by its kind: a background result
            # as its card, anything else as what it says (never a made-up process card).
            items.append(delivery_item(row))
            continue
        # A wake-up is what the server marked as one when it ran it, never text that merely
        # starts like one (anyone can type the marker).
        if row.role == "user" and meta.get("wake"):
            card = card_of_wake_text(content)
            if card is not None:
                items.append({"kind": "wakeup", "id": row_id, "card": card.as_dict()})
                after_wake = True
                continue
        failed = row.role == "user" and isinstance(meta, Mapping) and bool(meta.get("failed"))
        if failed and _retried(row, rows[index + 1 :]):
            continue  # its retry, the same text sent later, stands in its place
        if row.role == "user" and meta.get("superseded") == "regenerated":
            continue  # asked again as it was: the new turn shows the same message
        pending = meta.get("pending") if failed else None
        if isinstance(pending, str) and pending in live_streams:
            continue  # its turn runs now
        role = "assistant" if row.role == "assistant" else "user"
        item: JSONObject = {
            "kind": "message",
            "id": row_id,
            "role": role,
            "content": content,
            "wakeup": role == "assistant" and after_wake,
            "created_at": row.created_at,
        }
        if isinstance(meta, Mapping) and meta.get("stopped"):
            item["stopped"] = True
        if images := stored_images(meta):
            item["images"] = [{**image} for image in images]
        if meta.get("superseded"):
            item["superseded"] = _text(meta["superseded"])
        if meta.get("edited"):
            item["edited"] = "edited"
        if row.archived:
            item["archived"] = True  # summarised for the model; kept and shown
        if failed:
            item["failed"] = True
            item["error"] = _text(meta.get("error")) or "the turn failed"
        items.append(item)
        after_wake = False
    items.extend(_tool_item(step) for step in running)
    return items


# How each kind of delivery row is headed; a kind not named here shows its own name.
DELIVERY_TITLES = {
    "approval_turn_result": "Answer after approval",
    "approval_expired": "Approval expired",
    "scheduled_wakeup": "Scheduled wake-up",
    "inbound_event": "Inbound event",
    "schedule_missed": "Missed occurrence",
}
_RESULT_KINDS = frozenset({"async_delegation_complete"})


def delivery_item(row: MessageRecord) -> JSONObject:
    """A delivery row as its transcript item: a background result (a sub-agent's or a
    process's, ``display_kind`` ``async_delegation_complete``) as its wake-up card; any
    other kind as a ``delivery`` item with a heading, its text and the command it names."""
    meta = row.display_metadata or {}
    kind = row.display_kind or ""
    if kind in _RESULT_KINDS:
        return {"kind": "wakeup", "id": f"m{row.id}", "card": card_from_metadata(meta).as_dict()}
    return {
        "kind": "delivery",
        "id": f"m{row.id}",
        "display_kind": kind,
        "title": DELIVERY_TITLES.get(kind) or kind.replace("_", " ").capitalize(),
        "text": row.content,
        "command": _text(meta.get("command")) or None,
        "status": _text(meta.get("status")) or None,
        "created_at": row.created_at,
    }


def stored_images(meta: Mapping[str, Any]) -> list[dict[str, str]]:
    """A user's message's image attachments as stored (``api.attachments``), only the ones
    that are image data URLs: nothing else may become an image source on the page."""
    images = meta.get("images") if isinstance(meta, Mapping) else None
    if not isinstance(images, list):
        return []
    return [
        {"name": _text(i.get("name")), "url": i["url"]}
        for i in images
        if isinstance(i, Mapping) and isinstance(i.get("url"), str) and _IMAGE_URL.match(i["url"])
    ]


def _retried(failed: MessageRecord, after: Sequence[MessageRecord]) -> bool:
    """Whether a later user message is the same text as a failed one: its retry."""
    return any(m.role == "user" and m.content == failed.content for m in after)


def background_view(row: LedgerRow) -> JSONObject:
    """Unfinished background work of a session, as the chat's progress strip shows it: with
    the step and last output line the server running it last wrote."""
    progress = Progress.from_column(row.progress) if row.state == "running" else None
    return {
        "id": row.id,
        "kind": row.kind,
        "goal": _text(row.goal)[:300],
        "state": row.state,
        "started_at": row.started_at or row.created_at,
        "step": progress.step if progress else None,
        "line": progress.line if progress else None,
    }


def delivery_view(row: LedgerRow, *, max_attempts: int) -> JSONObject:
    """A ledger row as the Deliveries page shows it."""
    session = row.origin_ui_session_id or row.origin_session_id or row.session_key
    last_error = row.settled_reason if row.delivery_state == "dropped" else None
    return {
        "id": row.id,
        "kind": row.kind,
        "state": row.delivery_state,
        "work_state": row.state,
        "session_id": session,
        "attempts": row.delivery_attempts,
        "max_attempts": max_attempts,
        "last_error": last_error,
        "created_at": row.created_at,
        "updated_at": row.updated_at,
        "summary": _text(row.goal)[:300],
    }
