"""Combined wake-ups: the results of one session that arrive close together become ONE batch.

Ten sibling results finishing together used to start ten wake-up turns, each sending the
whole conversation to the model. A ``Coalescer`` gathers, per session, what arrives within
``window`` seconds of the first result, and everything that arrives while that session's
batch is being delivered (a push wake-up's turn runs inside the delivery), and hands each
batch to ``flush`` once: the surface claims every row of it, runs one wake-up turn that
lists each result and settles every claim by that one turn's answer.

Nothing is claimed while a result waits here, so the wait spends no attempt and a restart
loses nothing: the rows stay pending in the ledger, which offers them again. A result
offered twice while it waits (a re-offer) is gathered once. Batches of one session are
flushed one at a time; sessions are independent.

Each ``add`` returns that item's own outcome, so the runner's per-event bookkeeping (logs,
metrics) stays one line per result.

A lone result does not wait: given ``siblings`` (``siblings_running``: has the session other
work in the ledger that is still queued, running, or finished but not delivered yet, beyond
the batch?), the window applies only while it has, since only then can another result join
the batch. Without it, every batch waits.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from delivery.errors import LedgerError
from delivery.rows import RowQuery
from delivery.states import DeliveryState
from gateway.tasks import finish_or_cancel
from tools.delegation_runtime import get_runtime, runtime_is_open

__all__ = ["DEFAULT_COALESCE_SECONDS", "Coalescer", "Flush", "siblings_running"]

PENDING = DeliveryState.PENDING.value

# The ``[delivery] coalesce_seconds`` default: long enough for siblings that finish together
# (their results are written one by one), short enough not to be noticed as a delay.
DEFAULT_COALESCE_SECONDS = 2.0

logger = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

# flush(session_id, items in arrival order) -> each item's outcome by its key; a key missing
# from the answer gets the coalescer's ``missing`` outcome.
Flush = Callable[[str, Sequence[T]], Awaitable[Mapping[str, R]]]
Siblings = Callable[[str, frozenset[str]], bool]
"""Blocking (it reads the store): whether the session has other work on its way home."""


def siblings_running(session_id: str, batch: frozenset[str]) -> bool:
    """Whether the session (a routing key or either origin id) has ledger rows other than
    ``batch`` still waiting for delivery, on any server: queued or running work (its row is
    pending from the start) or a result whose event is not here yet (siblings that finished
    together are written together and offered one by one). True when it cannot tell."""
    if not runtime_is_open():
        return True
    views = get_runtime().ledger.views
    wanted = RowQuery(delivery_state=PENDING, session=session_id, limit=len(batch) + 1)
    try:
        found = {row.id for row in views.query(wanted)}
    except LedgerError:
        return True
    # Lone only when the session's pending rows are exactly the batch's: a row the query
    # does not find under the session (written without its session) cannot be told apart.
    return found != batch


@dataclass
class _Waiting(Generic[T, R]):
    item: T
    outcomes: list[asyncio.Future[R]] = field(default_factory=list)


class Coalescer(Generic[T, R]):
    """Per-session batches of items keyed by their delivery id (see the module docstring)."""

    def __init__(
        self, flush: Flush[T, R], *, window: float, missing: R, siblings: Siblings | None = None
    ) -> None:
        if window < 0:
            raise ValueError("the coalescing window must not be negative")
        self._flush = flush
        self._siblings = siblings
        self.window = window
        self._missing = missing
        self._waiting: dict[str, dict[str, _Waiting[T, R]]] = {}
        self._flushers: dict[str, asyncio.Task[None]] = {}

    def waiting(self, session_id: str) -> int:
        """How many items wait for the session's next batch (for tests and logs)."""
        return len(self._waiting.get(session_id, {}))

    async def add(self, session_id: str, key: str, item: T, *, window: float | None = None) -> R:
        """Gather ``item`` into the session's next batch and return its outcome once that
        batch was flushed. ``window`` overrides the wait before a NEW batch is flushed
        (0 for items that already waited, e.g. parked behind a turn)."""
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        batch = self._waiting.setdefault(session_id, {})
        waiting = batch.get(key)
        if waiting is None:
            batch[key] = waiting = _Waiting(item)
        else:
            waiting.item = item  # the newest offer of the same row (a re-offer says so)
        waiting.outcomes.append(future)
        if session_id not in self._flushers:
            delay = self.window if window is None else window
            task = asyncio.create_task(
                self._run(session_id, delay), name=f"wake-batch-{session_id}"
            )
            self._flushers[session_id] = task
        return await asyncio.shield(future)

    async def _run(self, session_id: str, delay: float) -> None:
        try:
            # Nothing else of the session runs: no sibling can join, so do not wait.
            siblings = self._siblings
            if delay > 0 and siblings is not None:
                gathered = frozenset(self._waiting.get(session_id, {}))
                if not await asyncio.to_thread(siblings, session_id, gathered):
                    delay = 0
            if delay > 0:
                await asyncio.sleep(delay)
            # What arrived while a batch was delivered is the next batch, flushed at once.
            while batch := self._waiting.pop(session_id, None):
                await self._flush_one(session_id, batch)
        finally:
            self._flushers.pop(session_id, None)
            leftover = self._waiting.pop(session_id, None)
            if leftover:
                # Only when cancelled (shutdown): nothing was claimed for these, the ledger
                # offers them again.
                self._settle(leftover, {}, self._missing)

    async def _flush_one(self, session_id: str, batch: dict[str, _Waiting[T, R]]) -> None:
        outcomes: Mapping[str, R] = {}
        try:
            outcomes = await self._flush(session_id, [w.item for w in batch.values()])
        except asyncio.CancelledError:
            self._settle(batch, {}, self._missing)
            raise
        except Exception:
            # The flush settles its own claims; an escape here means it could not, and the
            # claims lapse by themselves (the rows are offered again).
            logger.exception("a combined wake-up of session %s failed", session_id)
        self._settle(batch, outcomes, self._missing)

    @staticmethod
    def _settle(batch: dict[str, _Waiting[T, R]], outcomes: Mapping[str, R], missing: R) -> None:
        for key, waiting in batch.items():
            for future in waiting.outcomes:
                if not future.done():
                    future.set_result(outcomes.get(key, missing))

    async def close(self, grace_seconds: float) -> None:
        """Let batches being delivered finish for ``grace_seconds``, then cancel them (their
        claims are released by the flush, or lapse)."""
        await finish_or_cancel(set(self._flushers.values()), grace_seconds)
