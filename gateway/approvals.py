"""Human confirmation of shell commands, kept in the store, for every surface.

``confirm_for(session_id)`` is the ``ToolContext.confirm`` hook of that session's turns: it
records a pending ``ApprovalRecord`` for the turn holding the session (its running-turn
lease), announces it (the listener, and the ask's own ``on_asked``), and waits for a
decision. ``decide(approval_id, approve)`` decides it once, in the store, from whichever
server or surface the person uses (the web UI, ``POST /api/approvals/{id}`` of the API
server, a Telegram button, ``reveille approvals``). The asking server learns it at once when
the decision was made in this process (``settled``), from the web UI's shared event log, or
by reading the record every ``poll_seconds`` otherwise. The session is busy while its turn
runs, so wake-ups and other turns wait for the decision on every server and never cross it.
A turn stopped while it waits, or one that lost its session, denies the command.

An approval whose turn is gone (its server died or restarted, its lease lapsed) can never be
answered: deciding it settles it as denied and raises ``Expired``, so a late button press
gets a clear answer and the record ends decided, never pending for ever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable

from agent.tools import ConfirmCallback
from delivery.session_backend import ApprovalRecord
from gateway.session import SessionStore

__all__ = [
    "AlreadyDecided",
    "ApprovalListener",
    "ApprovalRecord",
    "Approvals",
    "Expired",
    "decide_approval",
    "pending_approvals",
]

logger = logging.getLogger(__name__)


class AlreadyDecided(Exception):
    """The approval was decided before."""


class Expired(AlreadyDecided):
    """The approval's turn is gone (a restart, a lapsed lease): it was settled as denied."""

    def __init__(self, record: ApprovalRecord) -> None:
        super().__init__(record.id)
        self.record = record


# Told of every change: the approval (pending, then decided).
ApprovalListener = Callable[[ApprovalRecord], Awaitable[None]]


def pending_approvals(store: SessionStore) -> list[ApprovalRecord]:
    """Every approval a running turn waits for, oldest first (a store read: call it off
    the event loop). One per busy session at most: a turn waits for one at a time."""
    found = []
    for session_id in store.running_turns():
        record = store.pending_approval(session_id)
        if record is not None:
            found.append(record)
    return sorted(found, key=lambda r: r.created_at)


def decide_approval(store: SessionStore, approval_id: str, approve: bool) -> ApprovalRecord:
    """Decide ``approval_id`` once (a store write: call it off the event loop).

    KeyError for an unknown id, AlreadyDecided for a decided one, Expired (after settling
    it as denied) for one whose turn no longer holds its session.
    """
    record = store.get_approval(approval_id)
    if record is None:
        raise KeyError(approval_id)
    if record.status != "pending":
        raise AlreadyDecided(approval_id)
    lease = store.running_turns().get(record.session_id)
    if lease is None or lease.stream_id != record.stream_id:
        settled, _ = store.decide_approval(approval_id, False)
        raise Expired(settled)
    decided, changed = store.decide_approval(approval_id, approve)
    if not changed:
        raise AlreadyDecided(approval_id)
    return decided


class Approvals:
    """Asks and decides approvals in the store (see the module docstring)."""

    def __init__(
        self,
        store: SessionStore,
        *,
        poll_seconds: float = 2.0,
    ) -> None:
        self.store = store
        self._listener: ApprovalListener | None = None  # set by ``listen``
        self._poll_seconds = poll_seconds
        # The decisions this process waits for, by approval id: a local decision wakes the
        # asking turn without waiting for the next read.
        self._waiting: dict[str, asyncio.Future[bool]] = {}

    def confirm_for(
        self, session_id: str, *, on_asked: ApprovalListener | None = None
    ) -> ConfirmCallback:
        """The hook of one turn; ``on_asked`` is told of each approval it records (the
        surface shows it: a message that the turn waits, a Telegram keyboard)."""

        async def confirm(command: str) -> bool:
            return await self._ask(session_id, command, on_asked)

        return confirm

    def listen(self, on_change: ApprovalListener) -> None:
        """Be told of every change (the web UI's turns announce it to the open tabs)."""
        self._listener = on_change

    async def _on_change(self, approval: ApprovalRecord) -> None:
        if self._listener is not None:
            await self._listener(approval)

    async def _ask(
        self, session_id: str, command: str, on_asked: ApprovalListener | None = None
    ) -> bool:
        turns = await asyncio.to_thread(self.store.running_turns)
        lease = turns.get(session_id)
        if lease is None:
            logger.warning("a command in %s asked for approval outside a turn: denied", session_id)
            return False
        approval = ApprovalRecord(
            id=f"appr_{secrets.token_hex(8)}",
            session_id=session_id,
            stream_id=lease.stream_id,
            command=command,
            status="pending",
            created_at=time.time(),
        )
        if not await asyncio.to_thread(self.store.ask_approval, approval):
            return False  # the turn no longer holds its session
        decided = asyncio.get_running_loop().create_future()
        self._waiting[approval.id] = decided
        try:
            # Inside the try: a stop that lands while the approval is still being announced
            # must deny it too, or it would stay pending and keep the session busy.
            await self._on_change(approval)
            if on_asked is not None:
                await on_asked(approval)
            return await self._decision(approval.id, decided)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._deny_on_stop(approval.id))
            raise
        finally:
            self._waiting.pop(approval.id, None)

    async def _decision(self, approval_id: str, decided: asyncio.Future[bool]) -> bool:
        while True:
            with contextlib.suppress(TimeoutError):
                return await asyncio.wait_for(asyncio.shield(decided), self._poll_seconds)
            record = await asyncio.to_thread(self.store.get_approval, approval_id)
            if record is None:
                return False
            if record.status != "pending":
                if record.status == "approved":
                    return True
                await self._on_change(record)  # denied elsewhere, or its turn lost its lease
                return False

    async def _deny_on_stop(self, approval_id: str) -> None:
        record, changed = await asyncio.to_thread(self.store.decide_approval, approval_id, False)
        if changed:
            await self._on_change(record)

    async def decide(self, approval_id: str, approve: bool) -> ApprovalRecord:
        """KeyError for an unknown id, AlreadyDecided for a decided one, Expired (a kind of
        AlreadyDecided) for one whose turn is gone."""
        try:
            record = await asyncio.to_thread(decide_approval, self.store, approval_id, approve)
        except Expired as exc:
            await self._on_change(exc.record)
            raise
        self.settled(approval_id, approve)
        await self._on_change(record)
        return record

    def settled(self, approval_id: str, approve: bool) -> None:
        """An approval was decided (here, or through another server's event): the turn
        waiting for it in this process, if any, goes on."""
        waiting = self._waiting.get(approval_id)
        if waiting is not None and not waiting.done():
            waiting.set_result(approve)

    async def pending_for(self, session_id: str) -> ApprovalRecord | None:
        return await asyncio.to_thread(self.store.pending_approval, session_id)

    async def pending(self) -> list[ApprovalRecord]:
        """Every pending approval in the store (see ``pending_approvals``)."""
        return await asyncio.to_thread(pending_approvals, self.store)
