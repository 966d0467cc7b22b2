"""What starting a web UI turn answers, typed: ``TurnAccepted`` or ``TurnRefused``.

The web UI's own callers (its HTTP handlers, its wake-up delivery target) get these records
from ``WebTurns.astart`` on the event loop and act on them directly. Only the seed-pinned
entry point ``api.routes.start_session_turn`` speaks the historical dict shape (``_status``,
``error``, ``type``, ``retryable``, ``active_stream_id``), through ``as_dict``/``from_dict``.

Whether a refusal of a wake-up spends an attempt of the delivery budget is decided here,
once (``TurnRefused.refund``): a refusal the session or the runtime caused for a while (a
stale agent runtime, a retryable 503, a paused wake-up, a session busy with another
stream) gives the attempt back; every other refusal spends it.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass, field

from agent.messages import JSONObject

__all__ = ["TurnAccepted", "TurnAnswer", "TurnRefused"]

PAUSED = "process_wakeup_paused"


@dataclass(frozen=True, slots=True)
class TurnAccepted:
    """The turn runs: its events carry ``stream_id``. ``stored`` resolves once the turn
    ended: True when it is in the transcript (done, or stopped with what it had), False
    when it failed before storing anything; None for a turn that ran and was stored before
    (a replay of the same wake-up)."""

    stream_id: str
    session_id: str
    turn_id: str
    stored: Awaitable[bool] | None = field(default=None, compare=False, repr=False)

    def as_dict(self) -> JSONObject:
        return {"stream_id": self.stream_id, "session_id": self.session_id, "turn_id": self.turn_id}


@dataclass(frozen=True, slots=True)
class TurnRefused:
    """No turn runs. ``status`` is the HTTP status it answers with; ``kind`` a stable code
    (``agent_runtime_stale``, ``process_wakeup_paused``, ``active_stream``...)."""

    status: int
    error: str
    kind: str | None = None
    retryable: bool = False
    active_stream_id: str | None = None

    @property
    def busy(self) -> bool:
        """The session runs another turn: the wake-up waits for it to end."""
        return self.status == 409 and self.active_stream_id is not None

    @property
    def refund(self) -> bool:
        """Whether a wake-up refused so gets its delivery attempt back (module docstring)."""
        paused = self.status == 409 and PAUSED in (self.kind, self.error)
        return self.retryable or paused or self.busy

    def as_dict(self) -> JSONObject:
        answer: JSONObject = {"_status": self.status, "error": self.error}
        if self.kind is not None:
            answer["type"] = self.kind
        if self.retryable:
            answer["retryable"] = True
        if self.active_stream_id is not None:
            answer["active_stream_id"] = self.active_stream_id
        return answer

    @classmethod
    def from_dict(cls, answer: JSONObject) -> TurnRefused:
        """A refusal in the dict shape (anything without ``_status`` reads as a 500)."""
        status = answer.get("_status")
        kind, stream = answer.get("type"), answer.get("active_stream_id")
        return cls(
            status=status if isinstance(status, int) else 500,
            error=str(answer.get("error") or "refused"),
            kind=kind if isinstance(kind, str) else None,
            retryable=answer.get("retryable") is True,
            active_stream_id=stream if isinstance(stream, str) and stream else None,
        )


TurnAnswer = TurnAccepted | TurnRefused
