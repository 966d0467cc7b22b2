"""Re-offers pending completions at the moment they become due, without polling.

A pending row has a ``due_at`` (its lease end, its retry backoff, or a re-offer deadline)
and a ``holder``: the process responsible for offering it. This scheduler sleeps until the
earliest ``due_at`` in the ledger, or until a local holder or owner process dies (it waits on
a pidfd for each), or until this process writes an earlier due time, or until another
process sharing the store pokes it through the store's notifier. An idle process thus
delivers on time and never sits on due rows, and a row whose owner died while we run is
re-offered at once instead of at the next restart. A second before a due time it wakes to
read the rows due by then (``READ_AHEAD_SECONDS``): when thousands of timers fall due in one
second, reading and decoding them is done before it, and at it only their offers are
written, each a compare-and-set on what was read.

A scheduler is what makes its process a server of the store: ``start`` records the process
among the store's servers (``delivery.peers``) and the scheduler watches every live local
peer as well, so that when a peer is killed its queued and running work and its claims are
recovered by the survivors at once, without waiting for the peer to restart.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import selectors
import socket
import threading
from collections.abc import Callable
from typing import Any

from delivery.errors import LedgerError
from delivery.identity import ProcessIdentity
from delivery.ledger import Ledger
from delivery.notifier import Subscription
from delivery.peers import ServerRecord
from delivery.rows import LedgerRow

log = logging.getLogger(__name__)

_OWN_POKES = "own pokes"  # selector data of this process's own wake-up socket
OFFER_BATCH = 500  # due rows taken (one write) and offered at a time
# Rows due this soon are read (and decoded) before their time, at most this many, so that
# when ten thousand timers fall due in one second the scheduler only writes them then.
READ_AHEAD_SECONDS = 1.0
READ_AHEAD_ROWS = 10_000


def _due_at(row: LedgerRow) -> float:
    return row.due_at or 0.0  # rows read as due by a time have one


class ReofferScheduler:
    def __init__(
        self,
        ledger: Ledger,
        offer: Callable[[dict[str, Any]], None],
        *,
        max_sleep_seconds: float = 60.0,
        error_backoff_seconds: float = 1.0,
        label: str = "",
        on_pass: Callable[[], object] | None = None,
    ) -> None:
        self.ledger = ledger
        # Called at each pass (a poke from any server sharing the store starts one): the
        # runtime stops the work here whose rows were cancelled elsewhere.
        self._on_pass = on_pass
        self._label = label
        self.peers_at_start: list[ServerRecord] = []
        self._peer_names: dict[str, str] = {}
        self._offer = offer
        # Only a guard against what no pidfd can see (an owner on another host); the
        # scheduler never relies on it for rows of this host.
        self._max_sleep = max_sleep_seconds
        self._error_backoff = error_backoff_seconds
        # Pokes from this process (an earlier due time was written) ...
        self._wake_r, self._wake_w = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._wake_w.setblocking(False)
        self._wake_r.setblocking(False)  # _wait drains it until EAGAIN
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ, _OWN_POKES)
        # ... and from other processes sharing the store (an operator's `redeliver`),
        # through the store's own notifier.
        self._inbox: Subscription | None = None
        self._pidfds: dict[str, int] = {}
        self._target = float("inf")
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self.offered = 0
        # Pending rows read ahead of their due time, earliest first (``Ledger.read_ahead``):
        # only what was read, the store decides (each is offered by a compare-and-set).
        self._ahead: list[LedgerRow] = []
        self._next_beat: float | None = None  # when to renew this server's heartbeat

    def start(self) -> None:
        self._inbox = self.ledger.subscribe()
        try:
            self.peers_at_start = self.ledger.servers.register(self._label)
            self._next_beat = self.ledger.clock() + self.ledger.policy.peer_timeout_seconds / 3
        except LedgerError as exc:
            # Not fatal: rows still name their owners and holders, which are watched too.
            log.warning("could not record this server among the store's servers: %s", exc)
        if self._inbox is not None:
            self._selector.register(self._inbox.fileno(), selectors.EVENT_READ, self._inbox)
        self.ledger.add_due_listener(self._on_due)
        self._thread = threading.Thread(target=self._run, name="ledger-reoffer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self.ledger.remove_due_listener(self._on_due)
        self._poke()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with contextlib.suppress(LedgerError):
            self.ledger.servers.unregister()
        for fd in self._pidfds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._pidfds.clear()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()
        if self._inbox is not None:
            self._inbox.close()

    def _poke(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def _on_due(self, when: float) -> None:
        with self._lock:
            if when >= self._target:
                return
            self._target = when
        self._poke()

    # -- the loop ---------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                timeout = self._pass()
            except LedgerError as exc:
                log.warning("re-offer pass failed, retrying: %s", exc)
                timeout = self._error_backoff
            except Exception:
                log.exception("re-offer pass failed")
                timeout = self._error_backoff
            self._wait(timeout)

    def _pass(self) -> float:
        """Offer everything due now; return how long to sleep."""
        with self._lock:
            self._target = float("inf")
        if self._on_pass is not None:
            self._on_pass()
        for event in self.ledger.recover_abandoned():
            self._emit(event)
        self._offer_read_ahead()
        # In batches, each offered as soon as it is taken: when thousands of timers fall
        # due in one second, the first wake-ups go out while later ones are still taken.
        # The rows of dead holders are looked for with the first batch only: every read
        # costs a round trip, and under load a round trip is the GIL's to give back too.
        first = True
        while True:
            taken = self.ledger.take_due(limit=OFFER_BATCH, orphans=first)
            first = False
            for event in taken:
                self._emit(event)
            if len(taken) < OFFER_BATCH or self._stopped.is_set():
                break
        self._watch_processes()
        now = self.ledger.clock()
        if self._next_beat is not None and now >= self._next_beat:
            self._next_beat = self.ledger.servers.heartbeat()
        next_due = self.ledger.next_due_at()
        now = self.ledger.clock()
        sleep = self._max_sleep if next_due is None else max(next_due - now, 0.0)
        if next_due is not None and not self._ahead:
            if sleep <= READ_AHEAD_SECONDS:
                self._ahead = self.ledger.read_ahead(now + READ_AHEAD_SECONDS, READ_AHEAD_ROWS)
                now = self.ledger.clock()  # reading thousands of rows takes a while
                sleep = max(next_due - now, 0.0)
            else:  # wake in time to read them ahead
                sleep -= READ_AHEAD_SECONDS
        # Deadlines of liveness, not polls: renew our heartbeat in time, and look again
        # the moment a remote peer's heartbeat would lapse.
        for deadline in (self._next_beat, self.ledger.servers.next_lapse_at):
            if deadline is not None:
                sleep = min(sleep, max(deadline - now, 0.0) + 0.01)
        sleep = min(sleep, self._max_sleep)
        with self._lock:
            self._target = min(self._target, now + sleep)
            return max(self._target - now, 0.0)

    def _offer_read_ahead(self) -> None:
        """Offer the rows read ahead that are due now, a batch at a time; keep the rest."""
        if not self._ahead:
            return
        now = self.ledger.clock()
        cut = bisect.bisect_right(self._ahead, now, key=_due_at)
        due, self._ahead = self._ahead[:cut], self._ahead[cut:]
        for start in range(0, len(due), OFFER_BATCH):
            for event in self.ledger.offer_read(due[start : start + OFFER_BATCH], now):
                self._emit(event)
            if self._stopped.is_set():
                return

    def _emit(self, event: dict[str, Any]) -> None:
        try:
            self._offer(event)
            self.offered += 1
        except Exception:
            log.exception("offering a re-offered completion failed")

    def _watch_processes(self) -> None:
        """Hold a pidfd for every peer server and every other local process that holds or
        owns live rows."""
        wanted = self.ledger.live_identities()
        for peer in self.ledger.servers.peers():
            wanted.add(peer.identity)
            self._peer_names[peer.identity] = peer.describe()
        for ident in list(self._pidfds):
            if ident not in wanted:
                self._unwatch(ident)
        for ident in wanted - set(self._pidfds):
            proc = ProcessIdentity.parse(ident)
            if proc is None or not proc.is_local() or proc.is_known_dead():
                continue
            try:
                fd = os.pidfd_open(proc.pid)
            except (OSError, AttributeError):
                continue  # no pidfd support: the max-sleep guard still covers it
            if proc.is_known_dead():  # the pid may have been reused before we opened it
                os.close(fd)
                continue
            self._pidfds[ident] = fd
            self._selector.register(fd, selectors.EVENT_READ, ident)

    def _unwatch(self, ident: str) -> None:
        fd = self._pidfds.pop(ident, None)
        if fd is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(fd)
            with contextlib.suppress(OSError):
                os.close(fd)

    def _wait(self, timeout: float) -> None:
        if self._stopped.is_set():
            return
        for key, _ in self._selector.select(timeout):
            if key.data is _OWN_POKES:
                with contextlib.suppress(OSError):
                    while self._wake_r.recv(64):
                        pass
            elif key.data is self._inbox and self._inbox is not None:
                self._inbox.drain()
            else:
                peer = self._peer_names.pop(key.data, None)
                if peer is not None:
                    log.warning("server %s exited; taking over its work", peer)
                else:
                    log.info("process %s exited; re-offering what it held", key.data)
                self._unwatch(key.data)
