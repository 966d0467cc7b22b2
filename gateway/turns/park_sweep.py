"""The sweep that ends client-tool parks past their deadline without waiting for a request.

A turn parked on client tool calls (``gateway.turns.client_calls``) holds its session:
wake-ups wait behind it. Were it ended only by the session's next request, a client that
never comes back would hold its background results until their next re-offer found the
park expired. Every API server runs this sweep instead: at each pass it reads, from the
store, the sessions written since the last pass could have missed a deadline, and resumes
each park past its deadline with the timeout's error result per call (``timeout_outputs``).
The agent is told, its turn finishes and is stored, and the session is free again.

The store decides who ends a park: the resume carries an idempotency key named after the
park's row, so of every server sharing the store exactly one runs it (the others' claim
finds it running or finished). A request of the client that comes first ends the park
itself (``time_out``); the sweep's resume then finds nothing pending and stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from gateway.session import SessionStore
from gateway.turns.client_calls import ParkedCalls, find_parked, timeout_outputs
from gateway.turns.requests import ReplayedTurn, TurnError, TurnRequest
from gateway.turns.service import TurnService

__all__ = ["ParkSweep", "sweep_key"]

logger = logging.getLogger(__name__)

# Sessions read a trip while looking for recently written ones (newest first).
_PAGE = 100
# How far back the first pass looks: parks a server left while none ran.
_FIRST_LOOKBACK_SECONDS = 24 * 3600.0


def sweep_key(session_id: str, parked: ParkedCalls) -> str:
    """The idempotency key of the one resume that ends ``parked``."""
    return f"client-calls-timeout:{session_id}:{parked.row_id}"


class ParkSweep:
    """See the module docstring. ``every_seconds``: the gap between passes (by default a
    tenth of the timeout, between 1 and 30 seconds)."""

    def __init__(self, turns: TurnService, *, every_seconds: float | None = None) -> None:
        self.turns = turns
        self._every = every_seconds
        self._since: float | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def store(self) -> SessionStore:
        return self.turns.store

    def start(self) -> None:
        if self._task is None and self.turns.client_tool_timeout is not None:
            self._task = asyncio.create_task(self._loop(), name="client-park-sweep")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _gap(self, timeout: float) -> float:
        if self._every is not None:
            return self._every
        return min(max(timeout / 10, 1.0), 30.0)

    async def _loop(self) -> None:
        while True:
            try:
                await self.sweep_once()
            except Exception:
                logger.exception("the client-call park sweep failed (tried again shortly)")
            await asyncio.sleep(self._gap(self.turns.client_tool_timeout or 0.0))

    async def sweep_once(self) -> int:
        """One pass: ends each park past its deadline. Returns how many this server ended."""
        timeout = self.turns.client_tool_timeout
        if timeout is None:
            return 0
        now = time.time()
        # A park is written at its deadline less the timeout and its session not touched
        # since then at the earliest: whatever was written before that of the last pass
        # had its deadline seen by it.
        since = (
            now - timeout - _FIRST_LOOKBACK_SECONDS
            if self._since is None
            else self._since - timeout - self._gap(timeout)
        )
        ended = 0
        for session_id in await asyncio.to_thread(self._written_since, since):
            parked = await find_parked(self.store, session_id)
            if parked is not None and parked.expired(now) and await self._end(session_id, parked):
                ended += 1
        self._since = now
        return ended

    def _written_since(self, since: float) -> list[str]:
        found: list[str] = []
        offset = 0
        while True:
            page = self.store.list_sessions(limit=_PAGE, offset=offset)
            for record in page:
                if record.updated_at < since:
                    return found
                found.append(record.id)
            if len(page) < _PAGE:
                return found
            offset += _PAGE

    async def _end(self, session_id: str, parked: ParkedCalls) -> bool:
        request = TurnRequest(
            session_id=session_id,
            messages=(),
            idempotency_key=sweep_key(session_id, parked),
            bind_key_to_request=False,
            tool_outputs=timeout_outputs(parked),
        )
        try:
            started = await self.turns.start(request)
        except TurnError as exc:
            # Ended meanwhile (the client came back, another server's sweep runs it), or
            # the server is full: the next pass looks again.
            logger.info("client-call park %s of session %s: %s", parked.row_id, session_id, exc)
            return False
        if isinstance(started, ReplayedTurn):
            return False
        await started.task
        logger.info(
            "client calls %s of session %s timed out: the agent was told, the turn ended",
            ", ".join(parked.call_ids),
            session_id,
        )
        return True
