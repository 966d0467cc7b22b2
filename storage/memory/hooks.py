"""The inbound-event store in this process's memory (``delivery.inbound_backend``): for tests
and embedding, where no other server shares it. One lock makes each operation atomic."""

from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING

from delivery.inbound_backend import HookEvent, HookSecret

if TYPE_CHECKING:
    from delivery.inbound_backend import HookBackend

__all__ = ["MemoryHooks"]


class MemoryHooks:
    """``HookBackend`` in memory (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: dict[tuple[str, str], HookEvent] = {}
        self._secrets: list[HookSecret] = []

    def record_event(self, event: HookEvent) -> HookEvent | None:
        with self._lock:
            key = (event.hook, event.webhook_id)
            if key in self._events:
                return self._events[key]
            self._events[key] = event
            return None

    def events_since(self, hook: str, since: float, limit: int) -> list[HookEvent]:
        with self._lock:
            found = [e for e in self._events.values() if e.hook == hook and e.received_at >= since]
        found.sort(key=lambda e: (e.received_at, e.webhook_id))
        return found[-limit:] if limit > 0 else []

    def last_events(self) -> list[HookEvent]:
        newest: dict[str, HookEvent] = {}
        with self._lock:
            for e in sorted(self._events.values(), key=lambda e: (e.received_at, e.webhook_id)):
                newest[e.hook] = e
        return [newest[h] for h in sorted(newest)]

    def secrets(self, hook: str, now: float) -> list[HookSecret]:
        with self._lock:
            valid = [
                s
                for s in self._secrets
                if s.hook == hook and (s.expires_at is None or s.expires_at > now)
            ]
        return sorted(valid, key=lambda s: s.created_at, reverse=True)

    def rotate_secret(self, hook: str, secret: str, now: float, overlap_seconds: float) -> None:
        until = now + overlap_seconds
        with self._lock:
            self._secrets = [
                dataclasses.replace(s, expires_at=until)
                if s.hook == hook and (s.expires_at is None or s.expires_at > until)
                else s
                for s in self._secrets
            ]
            self._secrets.append(HookSecret(hook, secret, now))

    def prune_events(self, before: float, limit: int, *, dry_run: bool = False) -> int:
        with self._lock:
            old = sorted(
                (e for e in self._events.values() if e.received_at < before),
                key=lambda e: (e.received_at, e.webhook_id),
            )[: max(0, limit)]
            if not dry_run:
                for e in old:
                    del self._events[(e.hook, e.webhook_id)]
            return len(old)

    def hooks_with_secrets(self, now: float) -> list[str]:
        with self._lock:
            return sorted(
                {s.hook for s in self._secrets if s.expires_at is None or s.expires_at > now}
            )

    def close(self) -> None:
        pass


if TYPE_CHECKING:
    _conforms: type[HookBackend] = MemoryHooks
