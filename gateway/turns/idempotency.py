"""Idempotency keys of one turn service: a key's first request runs the turn, a repeat gets
its stored answer, and a key reused with another request is refused.

``IdempotencyClaims`` claims a key in the session store for an owner
``"<pid>:<boot token>:<nonce>:<fingerprint>"``: the fingerprint binds the key to the request
it was first sent with (``ANY_REQUEST`` for a key that names one piece of work whatever text
comes with it, a wake-up's), and the process part lets a restarted server take over a claim
its previous incarnation left running. Its answers are typed: ``None`` (run the turn), the
stored answer, or ``KeyReused`` / ``StillRunning`` raised.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets

from agent.messages import JSONObject
from gateway.session import SessionStore

__all__ = ["ANY_REQUEST", "IdempotencyClaims", "KeyReused", "StillRunning", "fingerprint_of"]

logger = logging.getLogger(__name__)

ANY_REQUEST = "any"
_ENVELOPE = frozenset({"fingerprint", "answer"})
_POLL_SECONDS = 0.05


class KeyReused(Exception):
    """The key was first sent with another request."""


class StillRunning(Exception):
    """The key's first request is still running, past the wait."""


def fingerprint_of(owner: str) -> str:
    """The request fingerprint a claim's owner carries."""
    return owner.rsplit(":", 1)[1]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class IdempotencyClaims:
    """The idempotency keys one turn service claims (see the module docstring)."""

    def __init__(self, store: SessionStore, *, wait_seconds: float) -> None:
        self.store = store
        self.wait_seconds = wait_seconds
        # A claim whose process is gone, or is this pid under another boot token, is void.
        self._boot = f"{os.getpid()}:{secrets.token_hex(8)}"

    def owner_for(self, fingerprint: str) -> str:
        return f"{self._boot}:{secrets.token_hex(6)}:{fingerprint}"

    async def claim(self, key: str, owner: str, session_id: str) -> JSONObject | None:
        """None when this request runs the turn; the stored answer when it was run before.

        The key is bound to the request it was first sent with: the same key with another
        request (another conversation's messages, say) is refused, never answered with the
        first request's reply.
        """
        fingerprint = fingerprint_of(owner)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_seconds
        while True:
            row = await asyncio.to_thread(
                self.store.claim_idempotent,
                key,
                owner,
                session_id=session_id,
                takeover=self.owner_gone,
            )
            if row["claimed"]:
                return None
            stored = row["response"]
            if row["state"] == "done" and isinstance(stored, dict):
                if _ENVELOPE.issubset(stored):
                    if _differ(fingerprint, stored["fingerprint"]):
                        raise KeyReused(key)
                    answer = stored["answer"]
                    return answer if isinstance(answer, dict) else {}
                return stored  # written before answers carried their request's fingerprint
            running_for = str(row.get("owner") or "").rsplit(":", 1)[-1]
            if row["state"] == "running" and _differ(fingerprint, running_for):
                raise KeyReused(key)
            if loop.time() >= deadline:
                raise StillRunning(key)
            await asyncio.sleep(_POLL_SECONDS)

    def owner_gone(self, owner: str) -> bool:
        """A running claim from a previous incarnation of the server is void."""
        pid_text, _, rest = owner.partition(":")
        token = rest.partition(":")[0]
        if f"{pid_text}:{token}" == self._boot:
            return False  # ours: a request of this process is running it
        try:
            pid = int(pid_text)
        except ValueError:
            return True
        # The same pid with another boot token is a restarted server (pid 1 in containers).
        return pid == os.getpid() or not _pid_alive(pid)

    async def forget(self, key: str | None, owner: str | None) -> None:
        """Give the claim back (the request failed), so that a repeat runs it again."""
        if key is None or owner is None:
            return
        try:
            await asyncio.to_thread(self.store.release_idempotent, key, owner)
        except Exception:
            logger.exception("could not release idempotency key %r", key)


def _differ(fingerprint: str, other: str) -> bool:
    return ANY_REQUEST not in (fingerprint, other) and other != fingerprint
