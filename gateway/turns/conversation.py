"""Which stored conversation a request belongs to, and what the model is shown of it.

Clients of an OpenAI-compatible API resend the whole conversation with every request and
often no session id. ``derive_session_id`` names a conversation by its opening; because
two conversations can open alike, ``pick_session`` continues a stored session only when the
history the request sends is that session's transcript (less what the server added itself:
delivery rows and wake-up turns), and gives anything else a session of its own.
``build_context`` is the model's context for a turn: the request's system prompt, the stored
transcript with earlier deliveries in place, this turn's new deliveries, the new message.
``well_formed`` keeps the model's text storable and sendable (no lone surrogates).
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

from agent.markers import DELIVERY_MARKER, defang
from agent.messages import ChatMessage, ContentPart
from gateway.turns.compaction import is_summary

# The row that ends a turn parked on client calls past its deadline (see
# ``gateway.turns.client_calls``, which imports this module's neighbours, not the reverse).
CLIENT_TIMEOUT_KEY = "client_tool_timeout"
CLIENT_CALLS_KEY = "client_tool_calls"

__all__ = [
    "build_context",
    "delivery_context_text",
    "derive_session_id",
    "message_text",
    "pick_session",
    "with_images",
]


def message_text(message: Mapping[str, Any]) -> str:
    """The text of a chat message whose content is a string or a list of text parts."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type", "text") == "text"
        )
    return ""


# ``json.dumps(..., ensure_ascii=False, separators=(",", ":"))``, built once instead of on
# every request (the text, and so every derived id, is the same).
_COMPACT_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def derive_session_id(messages: Sequence[Mapping[str, Any]]) -> str:
    """A stable id for a conversation: its system prompt and first user message, hashed."""
    # One pass (asked on every request without a session id): the system prompts, and the
    # first user message's text.
    system: list[str] = []
    first_user: str | None = None
    for m in messages:
        role = m.get("role")
        if role == "system":
            system.append(message_text(m))
        elif role == "user" and first_user is None:
            first_user = message_text(m)
    # JSON of a list keeps the parts apart: ("a", "bc") and ("ab", "c") differ.
    material = _COMPACT_JSON.encode([system, first_user or ""])
    return "api_" + hashlib.sha256(material.encode("utf-8")).hexdigest()[:24]


def delivery_context_text(contents: list[str]) -> str:
    """The system message that carries delivered rows into a turn: background results, and
    the answer of a turn that went on after its approval was decided."""
    return (
        f"{DELIVERY_MARKER} Delivered to this conversation while you were not running "
        "(results of background work started earlier, or the answer of a turn that went on "
        "after a person decided its approval):\n\n" + "\n\n".join(c.rstrip() for c in contents)
    )


def _last_user_index(messages: Sequence[Mapping[str, Any]]) -> int:
    """Where the request's new user message is (``ValueError`` when it has none)."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "user":
            return index
    raise ValueError("the request has no user message")


def _sent_history(messages: Sequence[Mapping[str, Any]], last: int) -> list[tuple[str, str]]:
    """The conversation a request says came before its new user message (at ``last``)."""
    if not last:
        return []  # a first message: nothing came before it
    return [
        (str(m["role"]), message_text(m).strip())
        for m in messages[:last]
        if m.get("role") in ("user", "assistant")
    ]


def _stored_history(transcript: tuple[Any, ...]) -> list[tuple[str, str]]:
    """A stored transcript as a client that never saw the server's own turns knows it."""
    out: list[tuple[str, str]] = []
    in_wake = False
    for m in transcript:
        if m.is_delivery:
            continue
        if m.role == "user" and m.display_metadata and m.display_metadata.get("failed"):
            continue  # never answered: no client's history holds it
        if m.display_metadata and m.display_metadata.get(CLIENT_TIMEOUT_KEY):
            continue  # the server ended a park: no client saw it
        if m.role == "user":
            in_wake = bool(m.display_metadata and m.display_metadata.get("wake"))
        if not in_wake and m.role in ("user", "assistant"):
            out.append((m.role, m.content.strip()))
    return out


def pick_session(
    messages: Sequence[Mapping[str, Any]],
    candidates: Sequence[tuple[str, tuple[Any, ...]]],
    *,
    retry_key: bool = False,
    home: str | None = None,
) -> str:
    """The session among ``candidates`` (the opening's sessions and their transcripts) that
    this request continues, or the id of a new one.

    No match, or more than one, starts a session of its own, ``<opening>_<random>``, which
    the same conversation's next request finds again. A request that repeats a session's
    last turn lands in that session only when it carries an idempotency key
    (``retry_key``): then it is a retry, answered from the key's record. Without one, a
    second conversation that opens like the first cannot be told from a retry, and a new
    session is the safe answer.
    """
    if home is None:  # the caller may have derived it already (a hash of the opening)
        home = derive_session_id(messages)
    if messages and messages[-1].get("role") == "tool":
        return _resumed_session(messages, candidates, retry_key=retry_key, home=home)
    last = _last_user_index(messages)  # found once for both
    sent = _sent_history(messages, last)
    new_user = ("user", message_text(messages[last]).strip())
    matching = []
    for sid, transcript in candidates:
        stored = _stored_history(transcript)
        if not stored and not sent and not retry_key:
            # An empty session is a first turn still running, perhaps on another server
            # sharing the store (a stream creates its session before it stores the turn):
            # only a retry of that very request (its key) may join it.
            continue
        repeat = (
            retry_key
            and len(stored) == len(sent) + 2
            and stored[: len(sent) + 1] == [*sent, new_user]
        )
        if stored == sent or repeat:
            matching.append(sid)
    if len(matching) == 1:
        return matching[0]
    if not matching and not sent and not any(sid == home for sid, _ in candidates):
        return home  # the first conversation with this opening
    return fork_of(home)


def _resumed_session(
    messages: Sequence[Mapping[str, Any]],
    candidates: Sequence[tuple[str, tuple[Any, ...]]],
    *,
    retry_key: bool,
    home: str,
) -> str:
    """The session a request that ends with tool results resumes: the one whose transcript
    is the conversation up to the assistant message that made the calls (with a retry key,
    also one that already stored the resumed turn's reply)."""
    cut = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
    sent = [
        (str(m["role"]), message_text(m).strip())
        for m in messages[: cut + 1]
        if m.get("role") in ("user", "assistant")
    ]
    matching = []
    for sid, transcript in candidates:
        stored = _stored_history(transcript)
        retried = retry_key and len(stored) == len(sent) + 1 and stored[: len(sent)] == sent
        if sent and (stored == sent or retried):
            matching.append(sid)
    return matching[0] if len(matching) == 1 else fork_of(home)


def fork_of(home: str) -> str:
    """A new session id of its own for a conversation that opens like ``home``'s."""
    return f"{home}_{secrets.token_hex(6)}"


def build_context(
    history: Sequence[Mapping[str, Any]],
    taken: Sequence[Mapping[str, Any]],
    request_messages: Sequence[Mapping[str, Any]],
    user_message: Mapping[str, Any],
    *,
    wakeup: bool = False,
    tail: Sequence[ChatMessage] | None = None,
) -> list[ChatMessage]:
    """The model's context: request system prompt, stored transcript, the new message (or,
    resuming a turn parked on client tool calls, its ``tail``: the tool exchange so far).

    Only the server's own wake-ups (``wakeup`` for the new message; the ``wake`` mark the
    server stored on earlier ones) reach the model with their markers; in text a person
    wrote they are defanged (``agent.markers.defang``), whatever it looks like.

    Delivery rows are folded here: the rows this turn took go into one system message
    tagged ``[reveille:delivery]`` right before the new user message; rows folded by
    earlier turns stay in the history at their place (each once, consecutive ones merged).
    Rows that arrive after the take wait for the next turn.

    Compaction (``gateway.turns.compaction``): archived rows are left out, and the summary that
    replaced them comes first, right after the request's system prompt.
    """
    taken_ids = {row["id"] for row in taken}
    # Each prompt's text read once (a comprehension would read it for its test and again).
    context: list[ChatMessage] = []
    for m in request_messages:
        if m["role"] in ("system", "developer"):
            prompt = message_text(m)
            if prompt:
                context.append({"role": "system", "content": prompt})
    if history:
        history = [row for row in history if not row.get("archived")]
        context.extend(
            {"role": "system", "content": row["content"]} for row in history if is_summary(row)
        )
        earlier: list[str] = []

        def flush() -> None:
            if earlier:
                context.append({"role": "system", "content": delivery_context_text(earlier)})
                earlier.clear()

        for row in history:
            if row["display_kind"] is not None:
                # Folded by an earlier turn: history, in its place. Taken just now (or not
                # yet foldable): not here.
                if row["folded"] and row["id"] not in taken_ids:
                    earlier.append(row["content"])
                continue
            if is_summary(row):
                continue  # placed first, above
            flush()
            meta = row.get("display_metadata") or {}
            if meta.get("failed") or meta.get("superseded"):
                # A web UI turn that failed: its message is shown (with a Retry) but was
                # never answered; a retry sends it again, so it is not history. Nor is a
                # message an edit or a regeneration replaced (shown as an earlier version).
                continue
            content = row["content"]
            if not content and meta.get(CLIENT_CALLS_KEY):
                continue  # a turn that only called client tools: its answer follows it
            if row["role"] == "user" and not meta.get("wake"):
                content = defang(content)
            context.append({"role": row["role"], "content": content})
        flush()
    else:
        # A new session: the client's own earlier messages are the history.
        # Where the new message is (the last time it occurs), found from the end in a loop
        # (no generator: every new conversation's turn asks).
        for last in range(len(request_messages) - 1, -1, -1):
            if request_messages[last] is user_message:
                break
        else:
            raise ValueError("the new message is not among the request's messages")
        if last:  # most new conversations send only their new message
            context.extend(
                {
                    "role": m["role"],
                    "content": defang(message_text(m)) if m["role"] == "user" else message_text(m),
                }
                for m in request_messages[:last]
                if m["role"] in ("user", "assistant")
            )
    if taken:
        # What arrived since the last turn, right before the new message: this turn is the
        # one that tells the model about it.
        context.append(
            {"role": "system", "content": delivery_context_text([row["content"] for row in taken])}
        )
    if tail is not None:
        context.extend(tail)
        return context
    text = message_text(user_message)
    context.append({"role": "user", "content": text if wakeup else defang(text)})
    return context


def bound_context(context: list[ChatMessage], budget_chars: int) -> list[ChatMessage]:
    """``context`` within ``budget_chars`` characters of content: never an unbounded history.

    The request's leading system messages, the results this turn folds and the new message
    stay; the oldest history goes first, replaced by one note that says how much was left
    out. A new message too long by itself keeps its head and its tail. (Summarising what is
    left out is compaction's job; this bound only keeps every request sendable.)
    """

    def size(messages: list[ChatMessage]) -> int:
        total = 0
        for m in messages:  # a loop, not a generator: every turn's context is measured
            total += len(str(m.get("content") or ""))
        return total

    if size(context) <= budget_chars:
        return context
    lead = 0
    while lead < len(context) - 1 and context[lead]["role"] == "system":
        lead += 1
    tail = 1
    if len(context) - tail > lead and DELIVERY_MARKER in str(context[-2].get("content") or ""):
        tail = 2  # the results this turn folds: it is the turn that tells the model
    head, history, end = context[:lead], context[lead:-tail], context[-tail:]
    # The oldest messages go until the rest fits: one pass over their sizes.
    excess = size(head) + size(history) + size(end) - budget_chars
    dropped = 0
    while dropped < len(history) and excess > 0:
        excess -= len(str(history[dropped].get("content") or ""))
        dropped += 1
    history = history[dropped:]
    if dropped:
        note = (
            f"[{dropped} earlier message(s) of this conversation are left out: it is longer "
            f"than the context budget of {budget_chars} characters]"
        )
        head = [*head, {"role": "system", "content": note}]
    room = budget_chars - size(head) - size(history) - size(end[:-1])
    last = end[-1]
    text = str(last.get("content") or "")
    if len(text) > max(room, 0):
        keep = max(room, 200) // 2
        cut = len(text) - 2 * keep
        text = f"{text[:keep]}\n[... {cut} characters left out ...]\n{text[-keep:]}"
        end = [*end[:-1], {**last, "content": text}]
    return [*head, *history, *end]


def with_images(context: list[ChatMessage], user_message: Mapping[str, Any]) -> list[ChatMessage]:
    """``context`` whose last message (the new user message, as text) also carries the
    ``image_url`` parts ``user_message`` came with, in order after its text.

    Only the new message's images reach the model: the transcript stores a message's text,
    so images of earlier turns are not sent again.
    """
    content = user_message.get("content")
    if not isinstance(content, list):
        return context
    images = [part for part in content if _is_image(part)]
    if not images or not context:
        return context
    last = context[-1]
    parts: list[ContentPart] = []
    if last.get("content"):
        parts.append({"type": "text", "text": str(last["content"])})
    return [*context[:-1], {**last, "content": [*parts, *images]}]


def _is_image(part: object) -> TypeGuard[ContentPart]:
    return isinstance(part, dict) and part.get("type") == "image_url"


@dataclass(frozen=True)
class _RepairedResult:
    content: str
    usage: Any
    finish_reason: str = "stop"


def well_formed(text: str) -> str:
    """``text`` with any lone UTF-16 surrogate replaced by U+FFFD: storable and sendable."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def well_formed_result(result: Any) -> Any:
    """An agent's result whose text can be stored and sent (see ``well_formed``): a model
    may emit a lone surrogate, and the turn is still stored and answered."""
    content = str(result.content or "")
    repaired = well_formed(content)
    if repaired == content:
        return result
    return _RepairedResult(
        repaired, getattr(result, "usage", None), getattr(result, "finish_reason", "stop")
    )
