"""Writing a finished turn into its session: the turn's rows, its idempotency record and, for
a new conversation, its session and title, in one commit.

The rows are the user message and the reply; a resumed turn (``gateway.turns.client_calls``)
stores only its reply, since its user message was stored with the park, and a reply that
parks carries the park. A new conversation's session is written by the same commit, with the
title taken from its first message; a session written earlier (a streamed turn, background
work started first: ``session_writer``) is titled by a second write, which never replaces a
title set meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from gateway.config import Platform
from gateway.session import (
    SessionGone,
    SessionStore,
    SessionStoreError,
    SessionTaken,
    title_from_text,
)
from gateway.turns.client_calls import ParkedCalls
from gateway.turns.compacting import BegunTurn
from gateway.turns.conversation import message_text
from gateway.turns.idempotency import fingerprint_of
from gateway.turns.requests import TurnError, TurnRequest, session_taken
from gateway.wake_text import wake_row_metadata

__all__ = ["TurnRecorder", "turn_rows"]

logger = logging.getLogger(__name__)


def turn_rows(
    request: TurnRequest,
    user_message: Mapping[str, Any],
    result: Any,
    park: dict[str, Any] | None = None,
    resumed: ParkedCalls | None = None,
) -> list[dict[str, Any]]:
    """The transcript rows a finished turn adds (see the module docstring)."""
    key = request.idempotency_key
    user_text = message_text(user_message)
    user_row: dict[str, Any] = {"role": "user", "content": user_text}
    if request.user_metadata:
        user_row["display_metadata"] = dict(request.user_metadata)
    if request.wakeup:
        user_row["display_metadata"] = wake_row_metadata(user_text)
    reply_row: dict[str, Any] = {"role": "assistant", "content": str(result.content or "")}
    if key is not None:
        # The dedupe keys make a turn stored twice (never expected) show up once.
        user_row["dedupe_key"] = f"idem:{key}:user"
        reply_row["dedupe_key"] = f"idem:{key}:assistant"
    if park is not None:
        reply_row["display_metadata"] = park
    if resumed is not None:
        # One answer per park, however often its results are sent.
        reply_row["dedupe_key"] = f"resumed:{resumed.row_id}"
        return [reply_row]
    return [user_row, reply_row]


class TurnRecorder:
    """Stores a surface's finished turns in ``store`` (see the module docstring), and counts
    them."""

    def __init__(self, store: SessionStore, platform: Platform) -> None:
        self.store = store
        self._platform = platform
        # Turns stored, and how many of them were wake-ups (read by the metrics).
        self.turns_stored = 0
        self.wake_turns = 0

    def session_writer(self, session_id: str, begun: BegunTurn) -> Callable[[], Awaitable[None]]:
        """Writes the turn's session now, if it is not written yet (once)."""

        async def write_session() -> None:
            if begun.unwritten is not None:
                try:
                    await self.store.acreate_session(
                        session_id, source=begun.unwritten, exclusive=begun.exclusive
                    )
                except SessionTaken:
                    raise session_taken(session_id) from None
                begun.unwritten = None

        return write_session

    async def record(
        self,
        request: TurnRequest,
        begun: BegunTurn,
        user_message: Mapping[str, Any],
        result: Any,
        response: dict[str, Any],
        owner: str | None,
        seen: list[int],
        resumed: ParkedCalls | None = None,
        park: dict[str, Any] | None = None,
    ) -> None:
        """Store the turn: its rows (``turn_rows``), the answer a repeated idempotency key
        replays, and a new conversation's session and title; ``seen`` are the delivery rows
        its model call was shown (compaction may fold them from now on)."""
        key = request.idempotency_key
        # A new conversation's own session (``exclusive``) is created by this commit: its
        # title goes in with it, instead of costing the turn a second write.
        titled = (
            begun.unwritten is not None and begun.exclusive and self._names_sessions(request, begun)
        )
        title = title_from_text(self._first_text(request, user_message)) if titled else None
        try:
            await self.store.aappend_turn(
                request.session_id,
                turn_rows(request, user_message, result, park, resumed),
                idempotency_key=key,
                # stored only to answer a repeated idempotency key (with the same request)
                response=(
                    {"fingerprint": fingerprint_of(owner), "answer": response}
                    if key is not None and owner is not None
                    else None
                ),
                create=begun.unwritten,
                title=title,
                exclusive=begun.exclusive,
                seen=seen,
            )
        except SessionTaken:
            raise session_taken(request.session_id) from None
        except SessionGone:
            raise TurnError(
                "session_deleted", f"session {request.session_id!r} was deleted while the turn ran"
            ) from None
        self.turns_stored += 1
        if request.wakeup:
            self.wake_turns += 1
        if not titled and self._names_sessions(request, begun):
            await self._title(request.session_id, self._first_text(request, user_message))

    def _names_sessions(self, request: TurnRequest, begun: BegunTurn) -> bool:
        """A conversation's first turn names it after its first message (a client that
        resends its history: the first one it sent), as the web UI names its own chats
        before they run; a title set meanwhile stays."""
        return not request.wakeup and not begun.history and self._platform is not Platform.WEBUI

    @staticmethod
    def _first_text(request: TurnRequest, user_message: Mapping[str, Any]) -> str:
        for message in request.messages:  # a loop, not a generator: every first turn asks
            if message["role"] == "user":
                user_message = message
                break
        return message_text(user_message)

    async def _title(self, session_id: str, text: str) -> None:
        title = title_from_text(text)
        if title is None:
            return
        try:
            await self.store.aset_title(session_id, title, if_untitled=True)
        except (SessionStoreError, ValueError) as exc:
            logger.warning("could not title session %s: %s", session_id, exc)
