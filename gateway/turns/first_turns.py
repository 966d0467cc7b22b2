"""The ids of new sessions whose first turn runs in this process and is not stored yet.

The store cannot see such a session until that turn's commit, so a second conversation
that opens the same way meanwhile is told apart here (it gets a fork of the id), not merged
into the session the first one is creating. Only a retry of that very request (the same
idempotency key) joins it. ``gateway.turns.service.TurnService.resolve_conversation``
reserves; the turn's end releases.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.turns.conversation import fork_of

__all__ = ["FirstTurns"]


@dataclass(slots=True)
class _FirstTurn:
    """One reserved id."""

    key: str | None  # the idempotency key the first request came with
    holders: int = 0  # requests resolved to this id whose turn has not ended


class FirstTurns:
    """Reservations of unwritten session ids (see the module docstring)."""

    def __init__(self) -> None:
        self._ids: dict[str, _FirstTurn] = {}

    def reserve(self, session_id: str, home: str, key: str | None) -> str:
        """Reserve ``session_id`` (derived from ``home``) for a request with ``key``: that
        id, or a fork of ``home`` while another conversation's first turn holds it."""
        first = self._ids.get(session_id)
        if first is not None and (key is None or first.key != key):
            session_id, first = fork_of(home), None
        if first is None:
            first = self._ids[session_id] = _FirstTurn(key)
        first.holders += 1
        return session_id

    def release(self, session_id: str) -> None:
        """One request that reserved ``session_id`` is over; the last frees the id."""
        first = self._ids.get(session_id)
        if first is not None:
            first.holders -= 1
            if first.holders <= 0:
                del self._ids[session_id]
