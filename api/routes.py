"""Turn entry points of the web UI, callable from any thread (the delivery consumer's too).

``start_session_turn`` answers the way the web UI's HTTP route does, as a dict: success
carries ``stream_id``, ``session_id`` and ``turn_id`` and no ``_status``; a refusal carries
``_status`` and ``error`` (400 message required, 404 session not found, 409
``agent_runtime_stale`` / ``process_wakeup_paused`` / an active stream with
``active_stream_id``, 503 ``retryable`` when storage or the web UI is unavailable).

The web UI server binds the object that really runs turns (``bind``) when it starts and
unbinds it when it stops; until then every turn is refused with a retryable 503, which a
wake-up answers by releasing its claim with a refund.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

from agent.messages import JSONObject

__all__ = ["SessionTurns", "bind", "session_is_busy", "start_session_turn", "unbind"]


class SessionTurns(Protocol):
    """What the web UI server provides to start turns from outside a request."""

    def start_turn(self, session_id: str, text: str, *, source: str) -> JSONObject: ...

    def is_busy(self, session_id: str) -> bool: ...


_lock = threading.Lock()
_bound: SessionTurns | None = None


def bind(turns: SessionTurns) -> None:
    global _bound
    with _lock:
        _bound = turns


def unbind(turns: SessionTurns) -> None:
    global _bound
    with _lock:
        if _bound is turns:
            _bound = None


def _current() -> SessionTurns | None:
    with _lock:
        return _bound


def refusal(status: int, error: str, **extra: Any) -> JSONObject:
    return {"_status": status, "error": error, **extra}


def start_session_turn(session_id: str, text: str, *, source: str = "webui") -> JSONObject:
    """Start a turn in a web UI session; see the module docstring for the answers."""
    if not isinstance(text, str) or not text.strip():
        return refusal(400, "message is required")
    if not isinstance(session_id, str) or not session_id:
        return refusal(404, "Session not found")
    turns = _current()
    if turns is None:
        return refusal(503, "the web UI is not running in this process", retryable=True)
    return turns.start_turn(session_id, text, source=source)


def session_is_busy(session_id: str) -> bool:
    """True while the session runs a turn or waits for a confirmation."""
    turns = _current()
    return turns is not None and turns.is_busy(session_id)
