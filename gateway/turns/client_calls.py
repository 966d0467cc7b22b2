"""A turn parked on client tool calls: stored, found again, timed out, resumed.

When the model calls a tool the client defined (``agent.tools.ToolOffer``), the turn stops
and its answer is the pending calls. The turn is stored then like any other (its user
message and an assistant row with the text shown so far) and the assistant row carries the
park in its display metadata (``CLIENT_CALLS_KEY``): the calls, the turn's tool exchange
so far (what the model is shown again on resume) and the deadline. That row lives in the
session's transcript, so the park is durable in every backend, survives a restart and is
seen by every server sharing the store.

The session is parked while that row is its newest non-delivery row. Meanwhile a new user
message is refused (``tool_calls_pending``) and a wake-up waits (``session_busy``), as
behind a pending approval; background results stay pending delivery rows and the resumed
turn folds them in, once. The client resumes with its outputs (``ToolOutput``); the
resumed turn continues the model's loop from the stored exchange and stores only its reply.
A park past its deadline (``[tools] client_timeout``) is ended by the sweep
(``gateway.turns.park_sweep``): any server sharing the store resumes the turn itself, each
call answered with an error result (``timeout_outputs``), once (its idempotency key); the
turn finishes and the wake-ups held behind it flow again at their next offer. A request to
the session that comes first (a new message, a wake-up offered again) ends it instead: a
note row ends it, that turn's model is shown each call answered with an error result
(``timeout_prefix``), and the session is free.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.messages import ChatMessage, ToolCall
from agent.tools import ToolOutput
from gateway.session import SessionGone, SessionStore
from gateway.turns.conversation import CLIENT_CALLS_KEY, CLIENT_TIMEOUT_KEY
from gateway.turns.requests import TurnError

__all__ = [
    "CLIENT_CALLS_KEY",
    "TIMEOUT_ERROR",
    "TIMEOUT_KEY",
    "ParkedCalls",
    "PendingResult",
    "answers_timeout",
    "check_request",
    "find_parked",
    "park_metadata",
    "resume_tail",
    "time_out",
    "timeout_outputs",
    "timeout_prefix",
    "without_park",
]

# The row that finished a park past its deadline: the server's, never part of a client's
# history (``gateway.turns.conversation``).
TIMEOUT_KEY = CLIENT_TIMEOUT_KEY
# The result the agent is shown for a call the client did not answer in time.
TIMEOUT_ERROR = json.dumps(
    {"error": "the client did not return a result for this tool call in time"}
)
# Rows read a trip: the park is nearly always the newest non-delivery row.
_PAGE = 8


@dataclass(frozen=True)
class ParkedCalls:
    """The pending client calls of a session's parked turn (model names)."""

    row_id: int
    calls: tuple[ToolCall, ...]
    steps: tuple[ChatMessage, ...]
    deadline: float
    timed_out: bool = False
    """Ended by this request (past its deadline): its turn tells the model each call's
    error result before the new message (``timeout_prefix``)."""

    def expired(self, now: float | None = None) -> bool:
        return (time.time() if now is None else now) >= self.deadline

    @property
    def call_ids(self) -> list[str]:
        return [call["id"] for call in self.calls]


@dataclass(frozen=True)
class PendingResult:
    """A parked turn's result as its surface renders it: the text shown so far, the usage,
    and the pending calls in the client's names."""

    content: str
    usage: Any
    pending_calls: list[ToolCall]


def check_request(
    parked: ParkedCalls | None, outputs: Sequence[ToolOutput] | None, *, wakeup: bool
) -> None:
    """Refuse a request that does not fit the session's park (see the module docstring)."""
    if outputs is None:
        if parked is None:
            return
        if wakeup:
            raise TurnError(
                "session_busy", f"the session waits for client tool calls: {_ids(parked)}"
            )
        raise TurnError(
            "tool_calls_pending",
            f"the assistant waits for the results of tool calls {_ids(parked)}: send them "
            "(role 'tool' messages / function_call_output items) before a new message",
        )
    if parked is None:
        raise TurnError("no_pending_tool_calls", "no tool calls of this session wait for results")
    sent = [output.call_id for output in outputs]
    unknown = [call_id for call_id in sent if call_id not in parked.call_ids]
    if unknown:
        raise TurnError(
            "unknown_call_id",
            f"unknown call_id {unknown[0]!r}: the pending tool calls are {_ids(parked)}",
        )
    missing = [call_id for call_id in parked.call_ids if call_id not in sent]
    if missing:
        raise TurnError(
            "missing_tool_outputs",
            f"results are missing for the pending tool calls {', '.join(missing)}",
        )


def _ids(parked: ParkedCalls) -> str:
    return ", ".join(parked.call_ids)


def park_metadata(
    calls: Sequence[ToolCall], steps: Sequence[ChatMessage], timeout_seconds: float
) -> dict[str, Any]:
    """The display metadata of the assistant row that parks a turn."""
    return {
        CLIENT_CALLS_KEY: {
            "calls": list(calls),
            "steps": list(steps),
            "deadline": time.time() + timeout_seconds,
        }
    }


def _parked_row(row_id: int, meta: Mapping[str, Any] | None) -> ParkedCalls | None:
    park = (meta or {}).get(CLIENT_CALLS_KEY)
    if not isinstance(park, dict):
        return None
    return ParkedCalls(
        row_id=row_id,
        calls=tuple(park.get("calls") or ()),
        steps=tuple(park.get("steps") or ()),
        deadline=float(park.get("deadline") or 0.0),
    )


async def find_parked(store: SessionStore, session_id: str) -> ParkedCalls | None:
    """The session's park, read from the end of its transcript (delivery rows that came
    after the park are passed over, a page at a time)."""

    def read() -> ParkedCalls | None:
        before: int | None = None
        while True:
            try:
                page = store.latest_messages(session_id, before_id=before, limit=_PAGE)
            except SessionGone:
                return None
            for row in reversed(page):
                if row.display_kind is None:
                    return _parked_row(row.id, row.display_metadata)
            if len(page) < _PAGE:
                return None
            before = page[0].id

    return await asyncio.to_thread(read)


def resume_tail(parked: ParkedCalls, outputs: Sequence[ToolOutput]) -> list[ChatMessage]:
    """The model's context after the stored transcript: the turn's tool exchange, then the
    client's results in the order of its calls."""
    by_id = {output.call_id: output.output for output in outputs}
    tail: list[ChatMessage] = [dict(step) for step in parked.steps]  # type: ignore[misc]
    tail.extend(
        {"role": "tool", "tool_call_id": call_id, "content": by_id[call_id]}
        for call_id in parked.call_ids
    )
    return tail


def timeout_outputs(parked: ParkedCalls) -> tuple[ToolOutput, ...]:
    """Each pending call answered with the timeout's error result."""
    return tuple(ToolOutput(call_id, TIMEOUT_ERROR) for call_id in parked.call_ids)


def answers_timeout(parked: ParkedCalls, outputs: Sequence[ToolOutput] | None) -> bool:
    """Whether ``outputs`` are the timeout's own results (the sweep's resume): they may
    resume a park past its deadline, which any other request ends instead."""
    return outputs is not None and tuple(outputs) == timeout_outputs(parked)


def timeout_prefix(parked: ParkedCalls) -> list[ChatMessage]:
    """The exchange of a park that timed out, each call answered with an error result."""
    return resume_tail(parked, timeout_outputs(parked))


def without_park(
    history: Sequence[Mapping[str, Any]], parked: ParkedCalls
) -> list[Mapping[str, Any]]:
    """``history`` less the park's row and the row that ended it: the model is shown the
    exchange itself instead (``resume_tail``, ``timeout_prefix``)."""
    return [
        row
        for row in history
        if row["id"] != parked.row_id
        and (row.get("display_metadata") or {}).get(TIMEOUT_KEY) is None
    ]


async def time_out(store: SessionStore, session_id: str, parked: ParkedCalls) -> None:
    """Finish a park past its deadline: a row that tells the agent (and a reader) which calls
    got no result, after which the session is free. Written once (its dedupe key)."""
    names = ", ".join(f"{call['function']['name']} ({call['id']})" for call in parked.calls)
    text = (
        f"The client did not return results for its tool calls {names} in time; "
        "the turn that made them ended without them."
    )
    await asyncio.to_thread(
        store.append_message,
        session_id,
        "assistant",
        text,
        display_metadata={TIMEOUT_KEY: list(parked.call_ids)},
        dedupe_key=f"client-calls-timeout:{parked.row_id}",
    )
