"""The running-turn lease of one API server or Telegram turn (the web UI holds its own).

Those surfaces run most turns without a lease: holding one costs two writes, and only an
approval or a wake-up needs the session kept for one turn. So a wake-up takes it before it
runs (``take``: a session whose turn waits for an approval refuses it, and the wake-up is
offered again later), and any other turn at the first command it must have approved
(``take`` too). Once taken, the lease is renewed every third of its life until the turn ends
(``release``): a pending approval keeps the session busy on every server sharing the store,
and a server that dies lets it lapse, which ends what it asked. A released hold is never
taken again: a background sub-agent that asks after its turn ended is denied (as the web
UI's are), instead of holding the session with nobody left to free it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets

from gateway.session import TURN_LEASE_SECONDS, SessionStore, SessionStoreError

__all__ = ["TurnHold", "end_lease", "renew_lease"]

logger = logging.getLogger(__name__)


async def renew_lease(store: SessionStore, session_id: str, stream_id: str) -> None:
    """Renew the turn lease of ``stream_id`` every third of its life; return once another
    holder has the session (this server stalled past the lease and it was taken over). A
    failing store is logged and tried again: the lease lasts until the next try."""
    while True:
        await asyncio.sleep(TURN_LEASE_SECONDS / 3)
        try:
            held = await asyncio.to_thread(store.renew_turn, session_id, stream_id)
        except SessionStoreError as exc:
            logger.warning("could not renew the turn lease of %s: %s", session_id, exc)
            continue
        if not held:
            logger.warning("a turn lost session %s to another holder", session_id)
            return


async def end_lease(store: SessionStore, session_id: str, stream_id: str) -> None:
    """Free the session of the turn ``stream_id``; a lease that cannot be ended now (the
    store is failing) lapses by itself within ``TURN_LEASE_SECONDS``."""
    try:
        await asyncio.to_thread(store.end_turn, session_id, stream_id)
    except SessionStoreError as exc:
        logger.warning("could not free session %s now (%s); its lease lapses", session_id, exc)


class TurnHold:
    """The lease of one turn of ``session_id`` (see the module docstring)."""

    def __init__(self, store: SessionStore, session_id: str) -> None:
        self.store = store
        self.session_id = session_id
        self.stream_id = f"turn_{secrets.token_hex(8)}"
        self.held = False
        self.closed = False
        self._renewer: asyncio.Task[None] | None = None

    async def take(self, *, wakeup: bool = False) -> bool:
        """Hold the session for this turn; False when another live turn holds it."""
        if self.held:
            return True
        if self.closed:
            return False
        lease = await asyncio.to_thread(
            self.store.take_turn, self.session_id, self.stream_id, wakeup=wakeup
        )
        if lease.stream_id != self.stream_id:
            return False
        self.held = True
        self._renewer = asyncio.create_task(self._renew(), name=f"hold-{self.session_id}")
        return True

    async def _renew(self) -> None:
        await renew_lease(self.store, self.session_id, self.stream_id)
        # Another server took the session over: what this turn asked was denied by that.
        self.held = False

    async def release(self) -> None:
        """End the lease (denying anything it still asks); a lease that cannot be ended now
        lapses by itself."""
        self.closed = True
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._renewer
            self._renewer = None
        if not self.held:
            return
        self.held = False
        await end_lease(self.store, self.session_id, self.stream_id)
