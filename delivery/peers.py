"""The servers that share one store: who they are, and which of them are still alive.

Every server records itself in the store when its re-offer scheduler starts (its process
identity, when it started, a label such as its listening addresses) and removes itself when
it stops. The scheduler of every other server watches each live local peer with a pidfd,
so when one is killed the survivors notice at once and recover its work as a restart would.
A peer that died without removing itself (SIGKILL, power loss) is pruned by whoever notices.

``ServerRecord`` is one server's record; ``delivery.roster`` holds one server's view of them
all.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from delivery.identity import ProcessIdentity


@dataclass(frozen=True, slots=True)
class ServerRecord:
    """One server sharing the store; ``identity`` is a ``ProcessIdentity`` string."""

    identity: str
    label: str
    started_at: float
    heartbeat_at: float

    @property
    def process(self) -> ProcessIdentity | None:
        return ProcessIdentity.parse(self.identity)

    def heartbeat_lapsed(self, now: float, timeout: float) -> bool:
        """True when this server is on another host and has not renewed its heartbeat for
        ``timeout`` seconds. A server on this host is judged by its pid alone (it can be
        proved alive or dead here), never by its heartbeat."""
        proc = self.process
        if proc is not None and proc.is_local():
            return False
        return self.heartbeat_at + timeout < now

    def is_known_dead(self, now: float | None = None, timeout: float | None = None) -> bool:
        """Dead by its pid (same host), or, given ``now`` and ``timeout``, by a lapsed
        heartbeat (another host)."""
        proc = self.process
        if proc is not None and proc.is_known_dead():
            return True
        return now is not None and timeout is not None and self.heartbeat_lapsed(now, timeout)

    def describe(self, now: float | None = None) -> str:
        """``pid 123 on host (api 127.0.0.1:8642), up 5 s`` — for the operator's log."""
        proc = self.process
        who = f"pid {proc.pid} on {proc.host}" if proc is not None else self.identity
        age = max((time.time() if now is None else now) - self.started_at, 0.0)
        label = f" ({self.label})" if self.label else ""
        return f"{who}{label}, up {age:.0f} s"
