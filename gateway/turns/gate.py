"""One gateway turn's approval plumbing (the API server's and Telegram's ``TurnService``).

``TurnGate.confirm`` is the turn's ``ToolContext.confirm``: before asking, it makes sure
the turn holds its session (``gateway.turns.hold``), then asks through the surface's
``confirm_for`` (``gateway.approvals.Approvals``), telling the surface of each approval
asked (``on_approval``: Telegram sends its keyboard). With parking (the API server), the
first approval answers the turn's client at once: ``park`` stores the turn as the client
sees it (its user message, what streamed so far and a note naming the approval) with its
idempotency record, resolves ``parked`` and ends the stream; the turn goes on once decided,
and its real answer becomes a delivery row (``APPROVED_TURN_DISPLAY_KIND``) that the next
client turn folds in, exactly once, like a background result. Later approvals of the same
turn are listed at ``GET /api/approvals``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from agent.messages import JSONObject
from agent.tools import ConfirmCallback, ToolProgress
from delivery.session_backend import ApprovalRecord
from gateway.session import SessionGone, SessionStore
from gateway.turns.fence import TurnTask
from gateway.turns.hold import TurnHold

__all__ = [
    "APPROVED_TURN_DISPLAY_KIND",
    "Note",
    "Parking",
    "TurnGate",
    "busy_reason",
    "first_answer",
    "pending_note",
]

logger = logging.getLogger(__name__)

# The delivery row a parked turn's real answer becomes.
APPROVED_TURN_DISPLAY_KIND = "approval_turn_result"


@dataclass(frozen=True)
class Note:
    """An answer the turn service writes itself (the parked note), shaped like a result."""

    content: str
    usage: Any = None


@dataclass
class Parking:
    """A turn that may be answered early: what it streamed, whether it was answered
    (``future``), and whether its end is being stored (then it can no longer park)."""

    future: asyncio.Future[JSONObject]
    streamed: list[str] = field(default_factory=list)
    storing: bool = False
    approval: ApprovalRecord | None = None


def pending_note(approval: ApprovalRecord) -> str:
    """What a client is told while its turn waits for ``approval``."""
    return (
        f"Waiting for approval: the agent wants to run {approval.command!r} "
        f"(approval {approval.id}). Decide it with POST /api/approvals/{approval.id} and "
        '{"approve": true} or {"approve": false} (API key required), or '
        f"`reveille approvals approve|deny {approval.id}` on the server. The turn goes on "
        "once decided; its answer then appears in this session's messages "
        f"(GET /api/sessions/{approval.session_id}/messages) and in your next turn."
    )


async def busy_reason(store: SessionStore, request: Any, hold: TurnHold) -> str | None:
    """Why a turn (a ``TurnRequest``) may not start now, or None: a wake-up holds the
    session before it runs; any turn is refused while another turn of the session waits
    for an approval (it would cross it)."""
    if request.unwritten:
        return None  # a new session: nothing can be pending in it
    if request.wakeup and await hold.take(wakeup=True):
        return None
    pending = await asyncio.to_thread(store.pending_approval, request.session_id)
    if pending is not None:
        return (
            f"session {request.session_id!r} waits for approval {pending.id} of the command "
            f"{pending.command!r}; decide it first (POST /api/approvals/{pending.id} or "
            f"`reveille approvals approve|deny {pending.id}`)"
        )
    if request.wakeup:
        return f"session {request.session_id!r} is busy with another turn"
    return None


# Stores the parked turn: (the note, the rendered answer with ``reveille_approval``).
StoreNote = Callable[[Note, JSONObject], Awaitable[None]]


class TurnGate:
    """See the module docstring."""

    def __init__(
        self,
        *,
        store: SessionStore,
        session_id: str,
        confirm_for: Callable[..., ConfirmCallback],
        hold: TurnHold,
        on_approval: Callable[[ApprovalRecord], Awaitable[None]] | None,
        render: Callable[[Any], JSONObject],
        parking: Parking | None,
        store_note: StoreNote,
        deltas: asyncio.Queue[str | ToolProgress | None] | None,
    ) -> None:
        self.store = store
        self.session_id = session_id
        self.hold = hold
        self.on_approval = on_approval
        self.render = render
        self.parking = parking
        self.store_note = store_note
        self.deltas = deltas
        self._ask = confirm_for(session_id, on_asked=self._asked)

    async def confirm(self, command: str) -> bool:
        if not await self.hold.take():
            logger.warning(
                "a command in %s needs approval while another turn holds the session: denied",
                self.session_id,
            )
            return False
        return bool(await self._ask(command))

    async def _asked(self, approval: ApprovalRecord) -> None:
        if self.parking is not None:
            await self.park(self.parking, approval)
        if self.on_approval is not None:
            await self.on_approval(approval)

    async def park(self, parking: Parking, approval: ApprovalRecord) -> None:
        """Answer the turn now with a note that it waits for ``approval``, stored so."""
        if parking.future.done() or parking.storing:
            return
        parking.approval = approval
        note = pending_note(approval)
        shown = "".join(parking.streamed)
        text = f"{shown}\n\n{note}" if shown.strip() else note
        response: JSONObject = {
            **self.render(Note(text)),
            "reveille_approval": {
                "id": approval.id,
                "command": approval.command,
                "status": approval.status,
                "session_id": approval.session_id,
            },
        }
        await self.store_note(Note(text), response)
        parking.future.set_result(response)
        if self.deltas is not None:
            self.deltas.put_nowait(note if not shown.strip() else "\n\n" + note)
            self.deltas.put_nowait(None)

    async def store_answer(self, content: str) -> None:
        """The real answer of a parked turn: a delivery row the next turn folds in."""
        approval = self._parked()
        if approval is None:
            return
        await self._append(
            approval,
            f"The command {approval.command!r} (approval {approval.id}) was decided; the turn "
            f"that asked it went on and answered:\n\n{content}",
        )

    async def store_failure(self, why: str) -> None:
        approval = self._parked()
        if approval is None:
            return
        with contextlib.suppress(Exception):
            await self._append(
                approval,
                f"The turn that asked approval {approval.id} for {approval.command!r} failed "
                f"after it was answered: {why}",
            )

    def _parked(self) -> ApprovalRecord | None:
        parking = self.parking
        if parking is None or not parking.future.done():
            return None
        return parking.approval

    async def _append(self, approval: ApprovalRecord, text: str) -> None:
        try:
            await asyncio.to_thread(
                self.store.append_message,
                self.session_id,
                "system",
                text,
                display_kind=APPROVED_TURN_DISPLAY_KIND,
                display_metadata={"approval_id": approval.id, "command": approval.command},
                dedupe_key=f"approval:{approval.id}",
            )
        except SessionGone:
            logger.info("session %s was deleted before its approved turn ended", self.session_id)


async def first_answer(
    task: asyncio.Task[JSONObject], parked: asyncio.Future[JSONObject] | None
) -> JSONObject:
    """The turn's answer, or the note that it waits for an approval, whichever is first.
    Neither is cancelled when the client goes away: the turn runs on and is stored."""
    if parked is None:
        if not task.done():
            # The caller waits on a future of its own, which the turn's end resolves: a
            # cancel of the caller cancels that future, never the turn. What a shield does,
            # with one future and one callback instead of its two and their loop steps; a
            # turn service's task resolves it in its own done callback (no second one).
            ended = task.take_waiter() if isinstance(task, TurnTask) else None
            if ended is None:
                ended = task.get_loop().create_future()
                task.add_done_callback(functools.partial(_resolve, ended))
            await ended
        return task.result()
    await asyncio.wait({task, parked}, return_when=asyncio.FIRST_COMPLETED)
    if parked.done():
        return parked.result()
    return task.result()


def _resolve(ended: asyncio.Future[None], _task: asyncio.Task[Any]) -> None:
    if not ended.done():  # not cancelled with its caller meanwhile
        ended.set_result(None)
