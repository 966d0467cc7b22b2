"""The servers that share one store: who they are, and which of them are still alive.

Every server records itself in the store when its re-offer scheduler starts (its process
identity, when it started, a label such as its listening addresses) and removes itself when
it stops. The scheduler of every other server watches each live local peer with a pidfd,
so when one is killed the survivors notice at once and recover its work as a restart would.
A peer that died without removing itself (SIGKILL, power loss) is pruned by whoever notices.

``ServerRecord`` is one server's record; ``ServerRoster`` is one server's view of them all
(its own record and heartbeat, its peers, and which servers of other hosts lapsed).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from delivery.identity import ProcessIdentity, holder_is_dead

if TYPE_CHECKING:  # the backend's protocol names ServerRecord: no import at run time
    from delivery.backend import LedgerBackend, LedgerTx

log = logging.getLogger(__name__)


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


class ServerRoster:
    """This server's record in the store and its view of the others.

    ``holding_work`` names the processes that hold or own live rows: a lapsed server's
    record is kept while it does (it is how its rows are known to be orphaned).
    """

    def __init__(
        self,
        backend: LedgerBackend,
        identity: str,
        *,
        clock: Callable[[], float],
        peer_timeout_seconds: float,
        holding_work: Callable[[], set[str]],
        notify_others: Callable[[], object],
    ) -> None:
        self._backend = backend
        self._identity = identity
        self._clock = clock
        self._timeout = peer_timeout_seconds
        self._holding_work = holding_work
        self._notify_others = notify_others
        self._label = ""
        # Servers of other hosts whose heartbeat lapsed: dead, like an exited local pid.
        # Refreshed from the store's records at every recovery pass.
        self.lapsed: frozenset[str] = frozenset()
        self.next_lapse_at: float | None = None  # the earliest a live remote peer lapses

    def register(self, label: str = "") -> list[ServerRecord]:
        """Record this process as a server of the store, tell the others, and return the
        live peers it shares the store with (dead ones found on the way are pruned)."""
        self._label = label
        self._put_own_record()
        self._notify_others()  # their schedulers start watching this process now
        return self.peers()

    def heartbeat(self) -> float:
        """Renew this server's heartbeat (servers of other hosts judge it alive by it);
        returns when the next renewal is due (a third of the peer timeout)."""
        return self._put_own_record() + self._timeout / 3

    def _put_own_record(self) -> float:
        now = self._clock()
        record = ServerRecord(self._identity, self._label, now, now)
        self._backend.write(lambda tx: tx.put_server(record), durable=False)
        return now

    def unregister(self) -> None:
        self._backend.write(lambda tx: tx.delete_server(self._identity), durable=False)

    def refresh_liveness(self) -> float | None:
        """Re-read the servers' heartbeats: those of other hosts that lapsed count as dead
        from now on. Returns (and keeps in ``next_lapse_at``) the earliest time a live
        remote peer's heartbeat will lapse, or None when there is none."""
        now = self._clock()
        lapsed: set[str] = set()
        next_lapse: float | None = None
        for record in self._backend.servers():
            if record.identity == self._identity:
                continue
            if record.heartbeat_lapsed(now, self._timeout):
                lapsed.add(record.identity)
            elif not (record.process and record.process.is_local()):
                at = record.heartbeat_at + self._timeout
                next_lapse = at if next_lapse is None else min(next_lapse, at)
        for ident in sorted(lapsed - self.lapsed):
            log.warning(
                "server %s stopped renewing its heartbeat (%.0f s); taking over its work",
                ident,
                self._timeout,
            )
        self.lapsed = frozenset(lapsed)
        self.next_lapse_at = next_lapse
        return next_lapse

    def is_dead(self, identity: str | None) -> bool:
        """Provably gone: an exited process of this host, or a lapsed server of another."""
        return holder_is_dead(identity, self.lapsed)

    def peers(self) -> list[ServerRecord]:
        """The other servers of this store that are not known to be dead; records of dead
        ones are removed (their work is recovered through its rows, not through these)."""
        peers: list[ServerRecord] = []
        dead: list[ServerRecord] = []
        for record in self._backend.servers():
            if record.identity == self._identity:
                continue
            if record.is_known_dead():
                dead.append(record)
            elif record.identity in self.lapsed:
                if record.identity not in self._holding_work():
                    dead.append(record)
            else:
                peers.append(record)
        if dead:

            def prune(tx: LedgerTx) -> None:
                for record in dead:
                    tx.delete_server(record.identity)

            self._backend.write(prune, durable=False)
        return peers
