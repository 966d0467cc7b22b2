"""One server's view of the servers sharing its store (``delivery.peers``): its own record
and heartbeat, its live peers, and which servers of other hosts stopped renewing theirs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from delivery.backend import LedgerBackend, LedgerTx
from delivery.identity import holder_is_dead
from delivery.peers import ServerRecord

log = logging.getLogger(__name__)


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
