"""What inbound events (``POST /v1/hooks/{name}``) need from a store: the events themselves,
deduplicated durably by their ``webhook-id``, and each hook's verification secrets.

An event is written here BEFORE the sender gets its 2xx; ``(hook, webhook_id)`` is a unique
key, so a re-post of the same event (a sender's retry, a second server taking it) finds the
first one and writes nothing new. The stored events are what a ``wake_when`` wait looks back
over when it is set after its event arrived (``delivery.inbound``).

A hook's secrets are stored in clear (an HMAC needs the secret itself, so it cannot be
hashed): in the ledger's file, created private, or the PostgreSQL database, and never logged.
A rotation keeps the secrets it replaces valid for an overlap window, so a sender switching
secrets is never refused in between.

Each dialect (``storage/*/hooks.py``) implements ``HookBackend`` with the same behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["HookBackend", "HookEvent", "HookSecret"]


@dataclass(frozen=True, slots=True)
class HookEvent:
    """One inbound event as it arrived: the hook it was posted to, the sender's
    ``webhook-id``, when it arrived here, and the exact body (JSON text, verified)."""

    hook: str
    webhook_id: str
    received_at: float
    body: str


@dataclass(frozen=True, slots=True)
class HookSecret:
    """A hook's verification secret (``whsec_...``); ``expires_at`` is set once a newer one
    replaced it (it stays valid until then: the rotation overlap)."""

    hook: str
    secret: str
    created_at: float
    expires_at: float | None = None


class HookBackend(Protocol):
    def record_event(self, event: HookEvent) -> HookEvent | None:
        """Store ``event`` unless its ``(hook, webhook_id)`` is stored already; returns
        None when it was new, else the event stored first (nothing is written then)."""
        ...

    def events_since(self, hook: str, since: float, limit: int) -> list[HookEvent]:
        """The hook's events received at or after ``since``, oldest first, at most
        ``limit`` (the newest ``limit`` when there are more)."""
        ...

    def last_events(self) -> list[HookEvent]:
        """The newest event of every hook that has one, by hook name."""
        ...

    def secrets(self, hook: str, now: float) -> list[HookSecret]:
        """The hook's secrets valid at ``now``, newest first."""
        ...

    def rotate_secret(self, hook: str, secret: str, now: float, overlap_seconds: float) -> None:
        """Make ``secret`` the hook's current one; those it replaces stay valid
        ``overlap_seconds`` longer (one transaction)."""
        ...

    def prune_events(self, before: float, limit: int, *, dry_run: bool = False) -> int:
        """Forget at most ``limit`` events received before ``before``, oldest first (with
        ``dry_run`` only count them); how many. Retention's ``hook_events`` kind: a re-post
        of a forgotten event would be taken as new, so they are kept for weeks."""
        ...

    def hooks_with_secrets(self, now: float) -> list[str]:
        """Names of the hooks that have a valid secret, sorted."""
        ...

    def close(self) -> None: ...
