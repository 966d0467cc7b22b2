"""Compaction inside a running turn: before the model call when the context nears the
model's window, and once more as the backstop when the provider refuses the context as too
long (unless the turn already streamed text or ran a tool). The summarising itself is
``gateway.turns.compaction.Compactor``; the turn service (``gateway.turns.service``) calls
these.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.messages import ChatMessage
from agent.providers.base import DeltaCallback, ProviderError
from agent.tools import ToolContext, ToolProgress
from gateway.session import SessionSource
from gateway.turns.compaction import Compactor
from gateway.turns.hold import TurnHold
from gateway.turns.requests import TurnRequest, TurnRunner

__all__ = ["BegunTurn", "TurnCompaction"]


@dataclass
class BegunTurn:
    """A turn the service has begun: the stored history it runs on (replaced when it is
    compacted), the delivery rows it took, and whether its session is still unwritten."""

    history: list[dict[str, Any]]
    taken: list[dict[str, Any]]
    # The session still has to be written (by the turn's commit or before background work).
    unwritten: SessionSource | None
    # ... and must be this turn's own: a new id that another server may have created since.
    exclusive: bool = False


class TurnCompaction:
    """The compaction steps of the turns of one turn service (see the module docstring)."""

    def __init__(self, compactor: Compactor | None, run_agent: TurnRunner) -> None:
        self.compactor = compactor
        self._run_agent = run_agent

    async def run(
        self,
        request: TurnRequest,
        begun: BegunTurn,
        hold: TurnHold | None,
        context_of: Callable[[list[dict[str, Any]]], list[ChatMessage]],
        context: list[ChatMessage],
        ctx: ToolContext,
        on_delta: DeltaCallback | None,
        extra: dict[str, Any],
    ) -> tuple[Any, list[ChatMessage]]:
        """Run the agent on ``context``; its result and the context it was given. The
        backstop of compaction: when the provider refuses the context as too long, compact
        harder and run once more, unless the turn already streamed text or ran a tool
        (running it again would repeat them)."""
        moved: list[bool] = []
        on_progress = ctx.on_progress

        async def delta(piece: str) -> None:
            moved.append(True)
            if on_delta is not None:
                await on_delta(piece)

        async def progress(step: ToolProgress) -> None:
            moved.append(True)
            if on_progress is not None:
                await on_progress(step)

        ctx.on_progress = progress
        tracked = delta if on_delta is not None else None
        try:
            return await self._run_agent(context, ctx, tracked, **extra), context
        except ProviderError as exc:
            if moved or not (exc.context_overflow and self.can_compact(begun)):
                raise
            before = begun.history
            context = context_of(await self.compact(request, begun, hold, force=True))
            if begun.history is before:
                raise  # nothing could be compacted: the refusal stands
            return await self._run_agent(context, ctx, tracked, **extra), context

    def can_compact(self, begun: BegunTurn) -> bool:
        # A session not written yet has no stored turns to summarise.
        return self.compactor is not None and begun.unwritten is None and bool(begun.history)

    def due(self, begun: BegunTurn, context: list[ChatMessage]) -> bool:
        return (
            self.can_compact(begun) and self.compactor is not None and self.compactor.due(context)
        )

    async def compact(
        self, request: TurnRequest, begun: BegunTurn, hold: TurnHold | None, *, force: bool
    ) -> list[Any]:
        """Compact the session before the model call (``gateway.turns.compaction``); the turn goes
        on with the compacted history (``begun.history`` is replaced), or as it was. It runs
        under the turn's own lease when the turn holds one (the web UI's; a held wake-up's),
        else the compactor takes one for itself."""
        assert self.compactor is not None
        lease = request.lease_stream_id
        if lease is None and hold is not None and hold.held:
            lease = hold.stream_id
        compacted = await self.compactor.compact(
            request.session_id,
            begun.history,
            begun.taken,
            lease=lease,
            force=force,
        )
        if compacted is not None:
            begun.history = compacted
        return begun.history
