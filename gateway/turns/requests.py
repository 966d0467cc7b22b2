"""What a surface and the turn service say to each other: a ``TurnRequest`` in; a
``StartedTurn`` (the running task, its deltas) or a ``ReplayedTurn`` (a repeated key's stored
answer) out; a ``TurnError`` with its ``kind`` for a refusal. Also the turn runner over an
agent, and the fingerprint that binds an idempotency key to its request.

The turn service itself is ``gateway.turns.service``, which re-exports these names.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agent.loop import Agent
from agent.messages import ChatMessage
from agent.providers.base import DeltaCallback, ModelOptions
from agent.tools import ToolContext, ToolOffer, ToolOutput, ToolProgress
from gateway.session import SessionSource
from gateway.turns.fence import TurnFence
from gateway.turns.idempotency import ANY_REQUEST

__all__ = [
    "Conversation",
    "ReplayedTurn",
    "ResponseRenderer",
    "StartedTurn",
    "TurnError",
    "TurnErrorKind",
    "TurnRequest",
    "TurnRunner",
    "agent_turn_runner",
    "request_fingerprint",
    "session_taken",
]

# Called with the model context, the tool context and a delta callback (None unless
# streaming), and with ``options=`` (``ModelOptions``) only when the request set some;
# returns an object with ``content`` and ``usage`` (an ``AgentResult``).
TurnRunner = Callable[..., Awaitable[Any]]

# The stored (and replayed) answer of a turn, in the surface's own shape.
ResponseRenderer = Callable[[Any], dict[str, Any]]

TurnErrorKind = Literal[
    "session_not_found",
    "session_deleted",
    "too_many_turns",
    "in_progress",
    "key_reused",
    "session_taken",
    "session_busy",
    "upstream",
    "tool_calls_pending",
    "no_pending_tool_calls",
    "unknown_call_id",
    "missing_tool_outputs",
]


class TurnError(Exception):
    """A turn that was refused or failed; ``kind`` says which (see ``TurnErrorKind``)."""

    def __init__(self, kind: TurnErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def agent_turn_runner(agent: Agent | Callable[[], Agent]) -> TurnRunner:
    """A turn runner over an ``Agent``, or over a factory making one per turn."""

    def run(
        messages: list[ChatMessage],
        ctx: ToolContext,
        on_delta: DeltaCallback | None,
        *,
        options: ModelOptions | None = None,
        offer: ToolOffer | None = None,
    ) -> Awaitable[Any]:
        # The agent's own coroutine, not one around it: every step of the turn (each
        # resumption while the model answers) would pass through that frame too.
        current = agent if isinstance(agent, Agent) else agent()
        return current.run(messages, ctx, on_delta=on_delta, options=options, offer=offer)

    return run


def request_fingerprint(request: TurnRequest) -> str:
    """What makes two requests "the same request" for an idempotency key."""
    if not request.bind_key_to_request:
        return ANY_REQUEST
    # Not ``stream``: a replay can be told as a stream or as one answer alike.
    bound: list[Any] = [request.session_id, request.messages]
    if request.tool_offer is not None:
        bound.append(repr(request.tool_offer))
    if request.model_options:
        # Only when set, so the fingerprints of requests without options stay as they were.
        bound.append(request.model_options.as_request())
    material = json.dumps(
        bound,
        sort_keys=True,
        separators=(",", ":"),
        default=str,
    )
    return hashlib.sha256(material.encode("ascii")).hexdigest()[:32]


@dataclass(frozen=True)
class TurnRequest:
    """One turn as a surface asks for it.

    ``messages`` is the request's conversation (validated: it holds a user message; the
    last one is the new turn). ``create`` is the source of a session this turn may create
    (a conversation without an explicit session id); None means the session must exist.
    """

    session_id: str
    messages: Sequence[Mapping[str, Any]]  # as the client sent them (checked where parsed)
    create: SessionSource | None = None
    idempotency_key: str | None = None
    stream: bool = False
    bind_key_to_request: bool = True
    """False for a key that names one piece of work whatever text comes with it (a wake-up
    keyed by its delivery id is re-rendered when re-offered, yet is the same wake-up)."""
    wakeup: bool = False
    """Set by the server, never by a client: the turn delivers background work (a wake-up).
    Its user message is stored with the ``wake`` mark the transcript and later contexts go
    by; text that merely looks like a wake-up is a person's text."""
    unwritten: bool = False
    """The surface has just read that no session, live or deleted, has this id (see
    ``Conversation``): the turn starts empty without reading the store again. Its first
    write creates the session and refuses an id deleted meanwhile, as after any read."""
    model_options: ModelOptions | None = None
    """The client's generation options, for every model call of the turn (None: defaults;
    the web UI and Telegram send none)."""
    lease_stream_id: str | None = None
    """The turn lease (``SessionStore.take_turn``) the surface holds for this turn, if any
    (the web UI's): a compaction runs under it instead of taking the session itself."""
    user_metadata: dict[str, Any] | None = None
    """Display metadata the surface stores with the user's message (the web UI: the images
    it came with, shown as thumbnails; that it edits an earlier message)."""
    traceparent: str | None = None
    """Set by the server for its own wake-ups only: the W3C traceparent of the delivery that
    sent it, whose child the turn's span becomes (``delivery.traces``)."""
    before_store: Callable[[], Awaitable[bool]] | None = None
    """Run once the reply is ready, as the first step of its store (``TurnFence``'s claim):
    False means a cancel won in the caller's own store (a stored response cancelled through
    another server); the turn then ends cancelled and stores nothing."""
    tool_offer: ToolOffer | None = None
    """The client's own function tools (and whether the server's are offered too): a call
    of one parks the turn (``gateway.turns.client_calls``). None: the server's tools only."""
    tool_outputs: tuple[ToolOutput, ...] | None = None
    """The client's results for the pending calls of the session's parked turn: this
    request resumes that turn instead of starting one with a new user message."""
    own_slot: bool = False
    """The caller counts this turn in a pool of its own (background responses,
    ``[responses] background_concurrency``): it takes none of ``max_concurrent_runs``, so
    background work never refuses a foreground turn or a wake-up."""


@dataclass(frozen=True)
class Conversation:
    """The session a headerless request continues, and whether that id was unwritten
    (neither live nor tombstoned) in the snapshot it was picked from."""

    session_id: str
    unwritten: bool


@dataclass(frozen=True)
class ReplayedTurn:
    """A repeated idempotency key whose first attempt finished: its stored answer."""

    response: dict[str, Any]


@dataclass(frozen=True)
class StartedTurn:
    """A running turn: ``task`` gives the rendered answer; ``deltas`` (streaming only) the
    content pieces as the agent writes them and its tool steps as they happen, then None."""

    task: asyncio.Task[dict[str, Any]]
    deltas: asyncio.Queue[str | ToolProgress | None] | None
    parked: asyncio.Future[dict[str, Any]] | None = field(default=None, compare=False)
    """With ``park_on_approval``: resolved with the stored answer that says an approval
    is pending, when the turn asks one before it finishes (the deltas then end too)."""
    fence: TurnFence = field(default_factory=TurnFence, compare=False)

    def cancel(self) -> bool:
        """Cancel the turn unless its store began: True when nothing of its reply will be
        stored, False when the reply is stored or being stored (already completed)."""
        return self.fence.cancel()


def session_taken(session_id: str) -> TurnError:
    """The refusal of a turn whose new session another server created first."""
    # Only another server's first turn of an alike conversation can get there first (this
    # server's own are told apart before they run); nothing of this turn was stored.
    return TurnError(
        "session_taken",
        f"another conversation that opens the same way created session {session_id!r} at "
        "the same moment; nothing of this request was stored: send it again",
    )
