"""The ledger's rules: lifecycle compare-and-sets, claims with leases, the attempt budget.

One row per unit of background work (a delegation, a background process, an interim
notice). The row is written before the work starts; its completion event is written with
the terminal state, before anyone is told; a consumer must claim the row before it hands
the event on and acknowledges it only after the hand-off was accepted. Every rule here is
written once against ``LedgerTx`` and so holds for every backend.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from delivery.backend import LedgerStore, LedgerTx, LedgerViews
from delivery.cancel import (
    ALREADY_FINISHED,
    CANCELLED,
    NOT_FOUND,
    CancelOutcome,
    Progress,
    cancelled_event,
    is_active,
    is_waiting,
)
from delivery.claims import check_id as _check_id
from delivery.claims import check_token as _check_token
from delivery.claims import claim_op, complete_op, release_op
from delivery.claims import load as _load
from delivery.claims import load_held as _load_held
from delivery.errors import (
    InvalidTransitionError,
)
from delivery.identity import current_identity
from delivery.ledger_recovery import LedgerRecovery
from delivery.notifier import Subscription
from delivery.policy import DeliveryPolicy
from delivery.recovery import redeliver_op
from delivery.recovery import settle_changes as _settle
from delivery.roster import ServerRoster
from delivery.rows import AuditEntry, LedgerRow, PrunedRow, RowQuery
from delivery.states import ACTIVE_STATES, DeliveryState, State, can_transition
from delivery.steady import SteadyWall, boot_clock
from delivery.write_future import WriteFuture

log = logging.getLogger(__name__)

PENDING = DeliveryState.PENDING.value
DELIVERED = DeliveryState.DELIVERED.value
DROPPED = DeliveryState.DROPPED.value


class Ledger(LedgerRecovery):
    """The delivery ledger of one process, over a shared backend (its rules use the
    ``LedgerBackend`` side, its reads for operators the ``LedgerViews`` side)."""

    def __init__(
        self,
        backend: LedgerStore,
        policy: DeliveryPolicy | None = None,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] | None = None,
        identity: str | None = None,
    ) -> None:
        """``clock`` is the wall clock rows are stamped with; ``monotonic`` a clock no step
        of it moves (default: ``CLOCK_BOOTTIME`` with the real wall clock; with an injected
        ``clock`` and none given, ``clock`` itself, i.e. no step protection)."""
        self.backend = backend
        # What operators and pages read goes through the read-only side, so that nothing
        # written for them can reach a write.
        self.views: LedgerViews = backend
        self.policy = policy or DeliveryPolicy()
        self.clock = clock
        if monotonic is None:
            monotonic = boot_clock if clock is time.time else clock
        # The replay age cap is measured from this, so that a wall clock stepped forward
        # cannot make a fresh result look too old (see ``delivery.steady``).
        self.steady = SteadyWall(clock, monotonic)
        self.identity = identity or str(current_identity())
        self._due_listeners: list[Callable[[float], None]] = []
        self._adopters: dict[str, Callable[[LedgerRow], bool | None]] = {}
        self._logged_dead_holders: set[str] = set()
        self.servers = ServerRoster(
            backend,
            self.identity,
            clock=clock,
            peer_timeout_seconds=self.policy.peer_timeout_seconds,
            holding_work=self.live_identities,
            notify_others=self.notify_others,
        )

    # -- notification of due times (the re-offer scheduler listens) -------------------------

    def add_due_listener(self, fn: Callable[[float], None]) -> None:
        self._due_listeners.append(fn)

    def remove_due_listener(self, fn: Callable[[float], None]) -> None:
        if fn in self._due_listeners:
            self._due_listeners.remove(fn)

    def _notify_due(self, when: float) -> None:
        for fn in list(self._due_listeners):
            try:
                fn(when)
            except Exception:  # a listener must never fail a durable write
                log.exception("due listener failed")

    # -- the work's lifecycle ---------------------------------------------------------------

    def create(self, row_id: str, **fields: Any) -> dict[str, Any]:
        """Write the row before the work can start; raises if it cannot be written.

        Takes the keywords of ``submit_create`` and waits for the commit.
        """
        return self.submit_create(row_id, **fields).result()

    def submit_create(
        self,
        row_id: str,
        *,
        kind: str,
        state: str = State.QUEUED,
        session_key: str | None = None,
        origin_session_id: str | None = None,
        origin_ui_session_id: str | None = None,
        goal: str | None = None,
        request: dict[str, Any] | None = None,
    ) -> WriteFuture[dict[str, Any]]:
        _check_id(row_id)
        if State(state) not in ACTIVE_STATES:
            raise InvalidTransitionError(f"a new row starts queued or running, not {state}")
        if request is not None and not isinstance(request, dict):
            raise TypeError("request must be a dict")
        now = self.clock()
        row = {
            "id": row_id,
            "kind": kind,
            "state": str(state),
            "delivery_state": PENDING,
            "session_key": session_key,
            "origin_session_id": origin_session_id,
            "origin_ui_session_id": origin_ui_session_id,
            "goal": goal,
            "request": request or {},
            "owner": self.identity,
            "created_at": now,
            "updated_at": now,
            "started_at": now if state == State.RUNNING else None,
        }

        def op(tx: LedgerTx) -> dict[str, Any]:
            tx.insert(row)
            return row

        return self.backend.submit(op)

    def schedule(
        self,
        row_id: str,
        *,
        kind: str,
        event: dict[str, Any],
        not_before: float,
        session_key: str | None = None,
        origin_session_id: str | None = None,
        origin_ui_session_id: str | None = None,
        goal: str | None = None,
        hook: str | None = None,
    ) -> LedgerRow:
        """Write a completion that is due later, in one insert: work whose only part is the
        passing of time (a timer; a ``wake_when`` wait, found by its ``hook``). Its event is
        stored now, so nothing is left to run; it is claimable, offered and replay-aged from
        ``not_before`` on (``submit_finish``), by whichever server shares the store then.
        Cancellable until then (``cancel``)."""
        _check_id(row_id)
        if not isinstance(event, dict):
            raise TypeError("a completion event must be a dict")
        if not isinstance(not_before, int | float) or isinstance(not_before, bool):
            raise TypeError("not_before must be a time in seconds since the epoch")
        now = self.clock()
        due = max(float(not_before), now)
        row = LedgerRow(
            id=row_id,
            kind=kind,
            state=State.COMPLETED.value,
            delivery_state=PENDING,
            session_key=session_key,
            origin_session_id=origin_session_id,
            origin_ui_session_id=origin_ui_session_id,
            goal=goal,
            request=None,
            event=event,
            owner=self.identity,
            holder=self.identity,
            created_at=now,
            updated_at=now,
            started_at=now,
            completed_at=now,
            claim_token=None,
            claim_consumer=None,
            claimed_at=None,
            claim_expires_at=0,
            delivery_attempts=0,
            refunds=0,
            next_attempt_at=due,
            due_at=due,
            settled_at=None,
            settled_reason=None,
            replay_from=due,
            restored=0,
            not_before=float(not_before),
            hook=hook,
        )
        values = row.as_dict()

        def op(tx: LedgerTx) -> None:
            tx.insert(values)
            tx.audit(row_id, "schedule", f"due at {due:.3f}", now)

        self.backend.write(op)
        self._notify_due(due)
        # Another server may sleep until a later due time: the poke makes it look again.
        self.notify_others()
        return row

    def bring_forward(self, row_id: str, event: dict[str, Any]) -> bool:
        """A completion not due yet (``schedule``) becomes due now, with ``event`` in place
        of the one it was written with: a ``wake_when`` wait whose event came before its
        expiry. One compare-and-set that the claim at the old due time races against (as
        ``cancel`` does), so exactly one of the two completions is ever offered; False when
        the row is due already, claimed, settled, brought forward before or unknown."""
        _check_id(row_id)
        if not isinstance(event, dict):
            raise TypeError("a completion event must be a dict")
        now = self.clock()

        def op(tx: LedgerTx) -> bool:
            row = tx.get(row_id)
            if row is None or not is_waiting(row, now):
                return False
            expect = {
                "delivery_state": PENDING,
                "claim_token": None,
                "not_before": row["not_before"],
            }
            changes = {
                "event": event,
                "not_before": now,
                "next_attempt_at": now,
                "due_at": now,
                "replay_from": now,
                "completed_at": now,
                "updated_at": now,
                "holder": self.identity,
            }
            if not tx.update(row_id, expect, changes):
                return False
            tx.audit(row_id, "bring_forward", "due now: the event it waited for came", now)
            return True

        fired = self.backend.write(op)
        if fired:
            self._notify_due(now)
            self.notify_others()
        return fired

    def start(self, row_id: str) -> bool:
        """queued -> running; False when the row was cancelled or taken meanwhile."""
        return self.transition(row_id, State.QUEUED, State.RUNNING)

    def transition(self, row_id: str, expected: str, new: str) -> bool:
        """A non-terminal lifecycle compare-and-set (terminal states go through ``finish``)."""
        _check_id(row_id)
        if not can_transition(expected, new):
            raise InvalidTransitionError(f"{expected} -> {new} is not a lifecycle edge")
        if State(new) not in ACTIVE_STATES:
            raise InvalidTransitionError("terminal states carry an event: use finish()")
        now = self.clock()

        def op(tx: LedgerTx) -> bool:
            changes: dict[str, Any] = {"state": str(new), "updated_at": now}
            if new == State.RUNNING:
                changes["started_at"] = now
            if tx.update(row_id, {"state": str(expected)}, changes):
                return True
            _load(tx, row_id, ("id",))
            return False

        return self.backend.write(op)

    def finish(
        self,
        row_id: str,
        *,
        expected: str,
        state: str,
        event: dict[str, Any],
        not_before: float | None = None,
    ) -> bool:
        """Terminal compare-and-set that stores the completion event, pending delivery."""
        return self.submit_finish(
            row_id, expected=expected, state=state, event=event, not_before=not_before
        ).result()

    def submit_finish(
        self,
        row_id: str,
        *,
        expected: str,
        state: str,
        event: dict[str, Any],
        not_before: float | None = None,
    ) -> WriteFuture[bool]:
        """``not_before``: the completion may not be claimed before then (a timer's firing
        instant). The row is due then, for whichever server shares the store; its replay
        age counts from then, so a timer set months ahead is never too old when it fires."""
        _check_id(row_id)
        if not isinstance(event, dict):
            raise TypeError("a completion event must be a dict")
        if not can_transition(expected, state) or State(state) in ACTIVE_STATES:
            raise InvalidTransitionError(f"{expected} -> {state} is not a terminal edge")
        now = self.clock()
        due = now + self.policy.lease_seconds
        changes = {
            "state": str(state),
            "event": event,
            "request": None,  # the event restates the whole request; keep rows small
            "updated_at": now,
            "completed_at": now,
            "replay_from": now,
            "holder": self.identity,
            "due_at": due,
        }
        later = not_before is not None and not_before > now
        if not_before is not None:
            if not isinstance(not_before, int | float) or isinstance(not_before, bool):
                raise TypeError("not_before must be a time in seconds since the epoch")
            # next_attempt_at is what every claim and re-offer already waits for.
            due = max(float(not_before), now)
            changes.update(
                not_before=float(not_before),
                next_attempt_at=due,
                due_at=due,
                replay_from=due,
            )

        settled_changes = {**changes, "holder": None, "due_at": None}

        def op(tx: LedgerTx) -> bool:
            if tx.update(row_id, {"state": str(expected), "delivery_state": PENDING}, changes):
                return True
            # Dropped while it ran (an operator, a deleted session): keep the result
            # queryable, but there is nothing to deliver, so the caller queues nothing.
            if tx.update(row_id, {"state": str(expected)}, settled_changes):
                return False
            _load(tx, row_id, ("id",))
            return False

        def after(f: WriteFuture[bool]) -> None:
            if f.exception() is None:
                self._notify_due(due)
                if later and f.result():
                    # A server that shares the store may be asleep until a later due time;
                    # the poke makes it look at the new, nearer one.
                    self.notify_others()

        fut = self.backend.submit(op)
        fut.add_done_callback(after)
        return fut

    # -- stopping work, and its progress (``delivery.cancel``) ------------------------------

    def cancel(self, row_id: str, *, by: str, deliver_here: bool = True) -> CancelOutcome:
        """Queued or running -> ``cancelled`` with a notice saying it was ``by`` who stopped it;
        one compare-and-set, so a result recorded first wins (``already_finished``) and one
        recorded after finds the row terminal. Cancelling twice answers ``already_finished``.

        ``deliver_here``: this process puts the notice on its own queue (a server). Without
        it (the CLI), the notice is due now for any server sharing the store to offer.
        """
        _check_id(row_id)
        if not isinstance(by, str) or not by.strip():
            raise ValueError("a cancel must say who made it")
        now = self.clock()
        due = now + self.policy.lease_seconds if deliver_here else now

        def op(tx: LedgerTx) -> CancelOutcome:
            row = tx.get(row_id)
            if row is None:
                return CancelOutcome(row_id, NOT_FOUND)
            kind, owner, state = row["kind"], row["owner"], row["state"]
            if is_waiting(row, now):
                return self._cancel_waiting(tx, row, by, now)
            if not is_active(state):
                return CancelOutcome(row_id, ALREADY_FINISHED, state, kind, owner)
            event: dict[str, Any] | None = cancelled_event(row, by, now)
            changes = {
                "state": CANCELLED,
                "event": event,
                "request": None,
                "updated_at": now,
                "completed_at": now,
                "replay_from": now,
                "holder": self.identity,
                "due_at": due,
            }
            if row["delivery_state"] != PENDING:  # dropped while it ran: nobody is told
                changes.update(holder=None, due_at=None)
                event = None
            if not tx.update(row_id, {"state": state}, changes):
                return CancelOutcome(row_id, ALREADY_FINISHED, None, kind, owner)
            tx.audit(row_id, "cancel", f"{state} -> cancelled by {by}", now)
            return CancelOutcome(row_id, CANCELLED, CANCELLED, kind, owner, event)

        outcome = self.backend.write(op)
        if outcome.status == CANCELLED:
            self._notify_due(due)
        return outcome

    @staticmethod
    def _cancel_waiting(tx: LedgerTx, row: dict[str, Any], by: str, now: float) -> CancelOutcome:
        """A completion not due yet (a timer) is cancelled by settling it unoffered: one
        compare-and-set that a claim at the due time races against, so it either fires
        once or never."""
        row_id, kind, owner = row["id"], row["kind"], row["owner"]
        expect = {
            "delivery_state": PENDING,
            "claim_token": None,
            "next_attempt_at": row["next_attempt_at"],
        }
        settled = _settle(DROPPED, now, f"cancelled by {by} before it was due")
        if not tx.update(row_id, expect, settled):
            return CancelOutcome(row_id, ALREADY_FINISHED, row["state"], kind, owner)
        tx.audit(row_id, "cancel", f"not due yet; cancelled by {by}", now)
        return CancelOutcome(row_id, CANCELLED, CANCELLED, kind, owner)

    def submit_progress(self, reports: dict[str, Progress]) -> WriteFuture[set[str]]:
        """Write what running units reported, in one operation; the future holds the ids
        whose rows are no longer running (cancelled elsewhere): their work is to stop.

        Not durable: a report lost to a power cut is only a stale line on a page.
        """
        for row_id in reports:
            _check_id(row_id)

        def op(tx: LedgerTx) -> set[str]:
            stale = set()
            for row_id, progress in reports.items():
                running = {"state": State.RUNNING.value}
                if not tx.update(row_id, running, {"progress": progress.as_column()}):
                    stale.add(row_id)
            return stale

        return self.backend.submit(op, durable=False)

    # -- delivery ---------------------------------------------------------------------------

    def claim(self, row_id: str, consumer: str) -> str | None:
        """A claim token, or None when the row is settled, not yet due, or held by another."""
        return self.submit_claim(row_id, consumer).result()

    # Claims and acknowledgements are not "durable" writes (see ``LedgerBackend``): losing
    # one in a power cut only makes the row pending again, and its redelivery is absorbed
    # by the sinks (delivery rows and wake turns are idempotent by delivery id).

    def submit_claim(self, row_id: str, consumer: str) -> WriteFuture[str | None]:
        return self.backend.submit(self._claim_op(row_id, consumer), durable=False)

    async def aclaim(self, row_id: str, consumer: str) -> str | None:
        return await self.backend.submit_async(self._claim_op(row_id, consumer), durable=False)

    def _claim_op(self, row_id: str, consumer: str) -> Callable[[LedgerTx], str | None]:
        return claim_op(row_id, consumer, self.clock(), self.policy, self.identity, self.is_dead)

    def complete(self, row_id: str, token: str) -> bool:
        """Acknowledge a delivery; only the current claim's holder can."""
        return self.submit_complete(row_id, token).result()

    def submit_complete(self, row_id: str, token: str) -> WriteFuture[bool]:
        return self.backend.submit(self._complete_op(row_id, token), durable=False)

    async def acomplete(self, row_id: str, token: str) -> bool:
        return await self.backend.submit_async(self._complete_op(row_id, token), durable=False)

    def _complete_op(self, row_id: str, token: str) -> Callable[[LedgerTx], bool]:
        return complete_op(row_id, token, self.clock())

    def release(self, row_id: str, token: str, *, retryable: bool = False) -> str:
        """Give a claim back. Returns the row's delivery state afterwards.

        An ordinary release keeps the counted attempt; at the budget the row is dropped.
        ``retryable=True`` refunds it (the refusal was transient and not the delivery's
        fault), but the next claim still waits for a growing backoff and the replay cap
        still drops the row in the end, so a refusing consumer can never loop hot.
        """
        outcome = self.backend.write(self._release_op(row_id, token, retryable))
        self._after_release(outcome)
        return outcome[0]

    async def arelease(self, row_id: str, token: str, *, retryable: bool = False) -> str:
        outcome = await self.backend.submit_async(self._release_op(row_id, token, retryable))
        self._after_release(outcome)
        return outcome[0]

    def _after_release(self, outcome: tuple[str, float | None]) -> None:
        if outcome[1] is not None:
            self._notify_due(outcome[1])

    def _release_op(
        self, row_id: str, token: str, retryable: bool
    ) -> Callable[[LedgerTx], tuple[str, float | None]]:
        now = self.clock()
        replay_now = self.steady.replay_now(now)
        return release_op(row_id, token, retryable, now, replay_now, self.policy, self.identity)

    def drop(self, row_id: str, reason: str, *, token: str | None = None) -> bool:
        """The target is gone for good: settle the row as dropped (never "delivered")."""
        _check_id(row_id)
        if token is not None:
            _check_token(token)
        now = self.clock()

        def op(tx: LedgerTx) -> bool:
            row = _load_held(tx, row_id, token)
            if row["delivery_state"] != PENDING:
                return False
            expect = {"delivery_state": PENDING, "claim_token": row["claim_token"]}
            if not tx.update(row_id, expect, _settle(DROPPED, now, reason)):
                return False
            tx.audit(row_id, "drop", reason, now)
            return True

        return self.backend.write(op)

    def redeliver(self, row_id: str, *, actor: str = "operator") -> LedgerRow:
        """Operator action: a dropped row goes back to pending with a fresh budget."""
        _check_id(row_id)
        now = self.clock()
        row = self.backend.write(redeliver_op(row_id, now, self.identity, actor))
        self._notify_due(now)
        return row

    # -- reads --------------------------------------------------------------------------------

    def get(self, row_id: str) -> LedgerRow | None:
        return self.backend.get(_check_id(row_id))

    def pruned(self, row_id: str) -> PrunedRow | None:
        """The tombstone retention left for the row, when it was pruned (``get`` is None)."""
        return self.backend.pruned(_check_id(row_id))

    def query(self, query: RowQuery) -> list[LedgerRow]:
        """Rows matching ``query`` (every filter given; newest first unless asked)."""
        return self.views.query(query)

    def history(self, row_id: str) -> list[AuditEntry]:
        return self.views.audit_log(_check_id(row_id))

    def next_due_at(self) -> float | None:
        """The earliest due time of a pending row, or None when nothing is pending."""
        return self.backend.next_due_at()

    def live_identities(self) -> set[str]:
        """Processes other than this one that hold pending rows or own unfinished work
        (the re-offer scheduler watches each local one for its exit)."""
        wanted = set(self.backend.pending_holders())
        for state in ACTIVE_STATES:
            wanted.update(self.backend.active_owners(state))
        wanted.discard(self.identity)
        return wanted

    # -- the store ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return self.backend.url

    def subscribe(self) -> Subscription | None:
        """Pokes from every process sharing this store (``notify_others``)."""
        return self.backend.notifier.subscribe()

    def notify_others(self) -> int:
        """Tell every process sharing this store to look now; how many were reached."""
        return self.backend.notifier.notify()

    def close(self) -> None:
        self.backend.close()
