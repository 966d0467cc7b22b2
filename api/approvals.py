"""Human confirmation of shell commands asked from web UI sessions.

``confirm_for(session_id)`` is the ``ToolContext.confirm`` hook of that session's turns: it
records a pending ``Approval``, announces it (``approval`` event), and waits for
``decide(approval_id, approve)`` (``POST /api/approvals/{id}``). While one is pending the
session counts as busy, so wake-ups wait for the decision and never cross it. A turn
stopped while it waits denies the command. Decided approvals are remembered (a bounded
number) so that deciding twice is told apart from an unknown id.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from agent.tools import ConfirmCallback

__all__ = ["AlreadyDecided", "Approval", "Approvals"]

_REMEMBERED = 1000


class AlreadyDecided(Exception):
    """The approval was decided before."""


@dataclass
class Approval:
    id: str
    session_id: str
    command: str
    status: str = "pending"
    decided: asyncio.Future[bool] | None = field(default=None, repr=False)

    def as_dict(self) -> dict[str, str]:
        return {"id": self.id, "command": self.command, "status": self.status}


# Told of every change: the approval (pending, then decided).
ApprovalListener = Callable[[Approval], Awaitable[None]]


class Approvals:
    """Pending and recently decided approvals of this process."""

    def __init__(self, on_change: ApprovalListener | None = None) -> None:
        self._listener = on_change
        self._lock = threading.Lock()  # is_pending is asked from the consumer's threads
        self._pending: dict[str, Approval] = {}
        self._decided: OrderedDict[str, Approval] = OrderedDict()

    def confirm_for(self, session_id: str) -> ConfirmCallback:
        async def confirm(command: str) -> bool:
            return await self._ask(session_id, command)

        return confirm

    async def _ask(self, session_id: str, command: str) -> bool:
        approval = Approval(
            id=f"appr_{secrets.token_hex(8)}",
            session_id=session_id,
            command=command,
            decided=asyncio.get_running_loop().create_future(),
        )
        with self._lock:
            self._pending[approval.id] = approval
        assert approval.decided is not None
        try:
            # Inside the try: a stop that lands while the approval is still being announced
            # must deny it too, or it would stay pending and keep the session busy.
            await self._on_change(approval)
            return await approval.decided
        except asyncio.CancelledError:
            if approval.status == "pending":
                self._settle(approval, "denied")
                await asyncio.shield(self._on_change(approval))
            raise

    def listen(self, on_change: ApprovalListener) -> None:
        """Be told of every change (the web UI's turns announce it to the open tabs)."""
        self._listener = on_change

    async def _on_change(self, approval: Approval) -> None:
        if self._listener is not None:
            await self._listener(approval)

    def _settle(self, approval: Approval, status: str) -> None:
        with self._lock:
            approval.status = status
            self._pending.pop(approval.id, None)
            self._decided[approval.id] = approval
            while len(self._decided) > _REMEMBERED:
                self._decided.popitem(last=False)

    async def decide(self, approval_id: str, approve: bool) -> Approval:
        """KeyError for an unknown id, AlreadyDecided for a decided one."""
        with self._lock:
            approval = self._pending.get(approval_id)
            if approval is None:
                if approval_id in self._decided:
                    raise AlreadyDecided(approval_id)
                raise KeyError(approval_id)
        self._settle(approval, "approved" if approve else "denied")
        if approval.decided is not None and not approval.decided.done():
            approval.decided.set_result(approve)
        await self._on_change(approval)
        return approval

    def pending_for(self, session_id: str) -> Approval | None:
        with self._lock:
            return next((a for a in self._pending.values() if a.session_id == session_id), None)

    def is_pending(self, session_id: str) -> bool:
        return self.pending_for(session_id) is not None
