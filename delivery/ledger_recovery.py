"""The ledger's recovery of work a dead server left behind: running rows adopted by a
kind's adopter or settled ``unknown``, queued ones ``interrupted``; after a restart every
pending completion offered again (``restore``); and, pass after pass, pending rows that
are due or whose holder died (``take_due``), offered again within the replay age cap.

A base of ``delivery.ledger.Ledger``: the ledger's lifecycle and claim rules stay there;
these read the attributes declared below.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Protocol, TypeVar, runtime_checkable

from delivery.backend import LedgerStore, LedgerTx
from delivery.claims import check_id as _check_id
from delivery.json_types import JSONObject
from delivery.policy import DeliveryPolicy
from delivery.recovery import abandoned_event, reoffer_op
from delivery.roster import ServerRoster
from delivery.rows import LedgerRow
from delivery.states import State
from delivery.steady import SteadyWall

__all__ = ["SCAN_LIMIT", "DueLocking", "LedgerRecovery"]

log = logging.getLogger("delivery.ledger")

SCAN_LIMIT = 10_000
_SCAN_LIMIT = SCAN_LIMIT
T = TypeVar("T")


@runtime_checkable
class DueLocking(Protocol):
    """A store that can read the due rows in the transaction that offers them, locked for
    it (PostgreSQL: ``SELECT ... FOR UPDATE SKIP LOCKED`` sent with its BEGIN). Over a
    network that saves a re-offer batch the separate read (and the locking of its rows by
    id); a store without it is read with ``due`` and written with ``write(apart=True)``."""

    def write_due(
        self,
        now: float,
        limit: int,
        op: Callable[[LedgerTx, list[LedgerRow]], T],
        *,
        durable: bool = True,
    ) -> T:
        """``op`` written apart (``LedgerBackend.write``'s ``apart``), handed the pending
        rows due at ``now`` (at most ``limit``, earliest first) no other transaction is
        working on, already locked for it: its ``lock_free`` of them finds all free."""
        ...

    def write_locked(
        self,
        row_ids: list[str],
        op: Callable[[LedgerTx], T],
        *,
        durable: bool = True,
    ) -> T:
        """``op`` written apart, with those of ``row_ids`` no other transaction is working
        on locked by the round trip that opens its transaction (rows read ahead of their
        due time, ``LedgerRecovery.offer_read``): its ``lock_free`` of them asks nothing."""
        ...


class LedgerRecovery:
    """Recovery of abandoned work and re-offers (see the module docstring)."""

    backend: LedgerStore
    policy: DeliveryPolicy
    clock: Callable[[], float]
    steady: SteadyWall
    identity: str
    servers: ServerRoster
    _adopters: dict[str, Callable[[LedgerRow], bool | None]]
    _logged_dead_holders: set[str]
    # The ledger's terminal compare-and-set (``Ledger.finish``).
    finish: Callable[..., bool]

    def is_dead(self, identity: str | None) -> bool:
        """Provably gone: an exited process of this host, or a lapsed server of another."""
        return self.servers.is_dead(identity)

    def set_adopter(self, kind: str, adopt: Callable[[LedgerRow], bool | None] | None) -> None:
        """Say who takes over the running rows of ``kind`` whose owner process died.

        Work of such a kind can outlive its owner (a background process keeps running after
        its server is killed). Instead of settling the row as ``unknown``, recovery makes
        this process its owner (a compare-and-set, so one survivor only) and hands the row
        to ``adopt``, which must finish it (``finish(expected="running")``) once its real
        outcome is known. ``adopt`` must not block; ``None`` removes the adopter. An adopter
        that returns False declines the row (not work it follows): it settles as without one.
        """
        if adopt is None:
            self._adopters.pop(kind, None)
        else:
            self._adopters[kind] = adopt

    def take_over(self, row_id: str, owner: str) -> bool:
        """Running row of the dead ``owner`` -> owned by this process; False if it was not
        (another survivor took it first, or it finished meanwhile)."""
        _check_id(row_id)
        now = self.clock()
        expect = {"state": State.RUNNING.value, "owner": owner}
        changes = {"owner": self.identity, "updated_at": now}

        def op(tx: LedgerTx) -> bool:
            if not tx.update(row_id, expect, changes):
                return False
            tx.audit(row_id, "adopt", f"taken over from {owner}", now)
            return True

        return self.backend.write(op)

    def recover_abandoned(self) -> list[JSONObject]:
        """Queued/running rows whose owner process is gone get a completion that says so.

        queued -> interrupted (the work never started: safe to run again);
        running -> unknown (it may have had effects: the user must decide), unless its kind
        has an adopter (``set_adopter``): then this process takes the row over and the
        adopter reports its real outcome.
        """
        self.servers.refresh_liveness()
        recovered: list[JSONObject] = []
        for state, new_state in ((State.QUEUED, State.INTERRUPTED), (State.RUNNING, State.UNKNOWN)):
            for owner in self.backend.active_owners(state):
                if owner == self.identity or not self.is_dead(owner):
                    continue
                for row in self.backend.rows_owned_by(owner, state, _SCAN_LIMIT):
                    adopt = self._adopters.get(row.kind) if state == State.RUNNING else None
                    if adopt is not None:
                        if self.take_over(row.id, owner):
                            try:
                                taken = adopt(dataclasses.replace(row, owner=self.identity))
                            except Exception:
                                log.exception("adopting %s failed", row.id)
                                taken = False
                            if taken is not False:
                                log.info(
                                    "recovered %s %s from dead server %s: taken over",
                                    row.kind,
                                    row.id,
                                    owner,
                                )
                                continue
                        else:
                            continue  # another survivor took it over, or it finished
                    event = abandoned_event(row, new_state, self.clock())
                    if self.finish(row.id, expected=state, state=new_state, event=event):
                        log.warning(
                            "recovered %s %s from dead server %s: %s, its conversation is told",
                            row.kind,
                            row.id,
                            owner,
                            new_state.value,
                        )
                        recovered.append(event)
        return recovered

    def restore(self) -> list[JSONObject]:
        """After a restart: every pending completion, oldest first, marked as restored.

        Rows past the replay age cap are dropped instead of replayed; rows under a live
        claim of a live process are left to that process.
        """
        self.recover_abandoned()
        now = self.clock()
        return self._take(self.backend.pending_with_event(_SCAN_LIMIT), now, "restore")

    def take_due(
        self, now: float | None = None, *, limit: int = _SCAN_LIMIT, orphans: bool = True
    ) -> list[JSONObject]:
        """Pending rows whose due time has come (at most ``limit``), or whose holder died:
        offered again. ``orphans=False`` leaves out the rows of dead holders: a pass that
        takes the due rows batch after batch looks for those once, with its first batch
        (they are all taken then, and none is held by a dead server afterwards)."""
        now = self.clock() if now is None else now
        orphaned = self._orphans() if orphans else []
        if isinstance(self.backend, DueLocking):

            def op(tx: LedgerTx, due: list[LedgerRow]) -> list[JSONObject]:
                candidates = self._candidates(due + orphaned)
                return self._reoffer(candidates, now, "orphan")(tx) if candidates else []

            # Losing it in a power cut loses no result (see ``_take``).
            return self.backend.write_due(now, limit, op, durable=False)
        return self._take(self.backend.due(now, limit) + orphaned, now, "orphan")

    def read_ahead(self, until: float, limit: int = _SCAN_LIMIT) -> list[LedgerRow]:
        """The pending rows due by ``until`` (at most ``limit``, earliest first), read before
        their time so that offering them when it comes (``offer_read``) is one write, not
        also a read and decoding of thousands of rows at the moment they fall due."""
        return self.backend.due(until, limit)

    def offer_read(self, rows: list[LedgerRow], now: float | None = None) -> list[JSONObject]:
        """Those of ``rows`` (read by ``read_ahead``) due at ``now``, offered again as
        ``take_due`` offers them. Each goes by a compare-and-set on the values read, so a
        row changed since (claimed, settled, moved to another time) is left as it now is;
        if it is still due, the next ``take_due`` finds it."""
        now = self.clock() if now is None else now
        due = [row for row in rows if row.due_at is not None and row.due_at <= now]
        if not isinstance(self.backend, DueLocking):
            return self._take(due, now, "orphan")
        candidates = self._candidates(due)
        if not candidates:
            return []
        return self.backend.write_locked(
            [row.id for row in candidates],
            self._reoffer(candidates, now, "orphan"),
            durable=False,  # losing it in a power cut loses no result (see ``_take``)
        )

    def _orphans(self) -> list[LedgerRow]:
        """The pending rows held by dead servers, once those still waiting for their time
        are this process's (``_adopt_waiting``)."""
        rows: list[LedgerRow] = []
        for holder in self.backend.pending_holders():
            if holder != self.identity and self.is_dead(holder):
                self._adopt_waiting(holder)
                held = self.backend.rows_held_by(holder, _SCAN_LIMIT)
                # Once per dead server: rows still backing off stay held by it, pass after pass.
                if held and holder not in self._logged_dead_holders:
                    self._logged_dead_holders.add(holder)
                    log.info(
                        "recovering %d undelivered result(s) held by dead server %s: %s",
                        len(held),
                        holder,
                        ", ".join(r.id for r in held[:10]) + (" ..." if len(held) > 10 else ""),
                    )
                rows.extend(held)
        return rows

    def _adopt_waiting(self, holder: str) -> int:
        """The rows of the dead ``holder`` that wait for a later attempt (timers not yet
        due): this process's, a statement per ``SCAN_LIMIT`` of them. Read and compared one
        by one, as the rows due now are, a restart with 90,000 timers took them over in
        passes of ten thousand, 40 seconds of reading; nothing about them changes but the
        holder. Losing it in a power cut loses nothing: the next pass does it again."""
        now = self.clock()
        adopted = 0
        while True:
            step = self.backend.write(
                lambda tx: tx.adopt_waiting(holder, self.identity, now, _SCAN_LIMIT),
                durable=False,
                apart=True,
            )
            adopted += step
            if step < _SCAN_LIMIT:
                break
        if adopted:
            log.info("took over %d waiting result(s) from dead server %s", adopted, holder)
        return adopted

    @staticmethod
    def _candidates(rows: list[LedgerRow]) -> list[LedgerRow]:
        """The rows to offer, oldest completion first, each once, those with an event."""
        seen: set[str] = set()
        candidates = []
        for row in sorted(rows, key=lambda r: (r.completed_at or 0, r.id)):
            if row.id in seen or row.event is None:
                continue
            seen.add(row.id)
            candidates.append(row)
        return candidates

    def _reoffer(
        self, candidates: list[LedgerRow], now: float, reason: str
    ) -> Callable[[LedgerTx], list[JSONObject]]:
        return reoffer_op(
            candidates,
            now,
            reason,
            self.policy,
            self.identity,
            self.servers.lapsed,
            replay_now=self.steady.replay_now(now),
        )

    def _take(self, rows: list[LedgerRow], now: float, reason: str) -> list[JSONObject]:
        candidates = self._candidates(rows)
        if not candidates:
            return []
        return self.backend.write(
            self._reoffer(candidates, now, reason),
            # Losing it in a power cut loses no result: the rows stay due and are offered
            # again (a redelivery, which the sinks absorb), as a lost claim would be.
            durable=False,
            apart=True,
        )
