"""The ledger's rules: lifecycle compare-and-sets, claims with leases, the attempt budget.

One row per unit of background work (a delegation, a background process, an interim
notice). The row is written before the work starts; its completion event is written with
the terminal state, before anyone is told; a consumer must claim the row before it hands
the event on and acknowledges it only after the hand-off was accepted. Every rule here is
written once against ``LedgerTx`` and so holds for every backend.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from delivery.backend import AtMost, Below, Increment, IsSet, LedgerStore, LedgerTx, LedgerViews
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
from delivery.errors import (
    ClaimMismatchError,
    InvalidTransitionError,
    UnknownDeliveryError,
)
from delivery.identity import current_identity
from delivery.ids import new_token
from delivery.notifier import Subscription
from delivery.policy import DeliveryPolicy
from delivery.recovery import abandoned_event, redeliver_op, reoffer_op
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

_SCAN_LIMIT = 10_000
_CLAIM_COLUMNS = (
    "delivery_state",
    "completed_at",
    "next_attempt_at",
    "claim_expires_at",
    "holder",
    "claim_token",
    "delivery_attempts",
)


def _check_id(row_id: object) -> str:
    if not isinstance(row_id, str):
        raise TypeError(f"a ledger id must be a string, not {type(row_id).__name__}")
    if not row_id or len(row_id) > 200:
        raise ValueError("a ledger id must be 1 to 200 characters")
    return row_id


def _check_token(token: object) -> str:
    if not isinstance(token, str) or not token:
        raise TypeError("a claim token must be the non-empty string claim() returned")
    return token


def _load(tx: LedgerTx, row_id: str, columns: tuple[str, ...] | None = None) -> dict[str, Any]:
    row = tx.get(row_id, columns)
    if row is None:
        raise UnknownDeliveryError(f"no ledger row {row_id!r}")
    return row


def _load_held(tx: LedgerTx, row_id: str, token: str | None) -> dict[str, Any]:
    """The row, provided ``token`` (when given) is its current claim's."""
    row = _load(tx, row_id)
    if token is not None and row["claim_token"] != token:
        raise ClaimMismatchError(
            f"{row_id}: that claim token is not the current holder's "
            f"(delivery_state={row['delivery_state']}); nothing was written"
        )
    return row


class Ledger:
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
        self._adopters: dict[str, Callable[[LedgerRow], None]] = {}
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
    ) -> LedgerRow:
        """Write a completion that is due later, in one insert: work whose only part is the
        passing of time (a timer). Its event is stored now, so nothing is left to run; it
        is claimable, offered and replay-aged from ``not_before`` on (``submit_finish``),
        by whichever server shares the store then. Cancellable until then (``cancel``)."""
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
        _check_id(row_id)
        if not isinstance(consumer, str) or not consumer:
            raise TypeError("consumer must be a non-empty string naming who claims")
        now = self.clock()
        policy = self.policy
        identity = self.identity

        token = new_token()
        expires = now + policy.lease_seconds
        claimed = {
            "claim_token": token,
            "claim_consumer": consumer,
            "claimed_at": now,
            "claim_expires_at": expires,
            "holder": identity,
            "due_at": expires,
            "updated_at": now,
        }
        # One statement for the common case: pending, due, unclaimed, under the budget.
        fast_expect = {
            "delivery_state": PENDING,
            "completed_at": IsSet(),
            "next_attempt_at": AtMost(now),
            "claim_expires_at": AtMost(now),
            "delivery_attempts": Below(policy.max_attempts),
        }
        fast_changes = {**claimed, "delivery_attempts": Increment(1)}

        def op(tx: LedgerTx) -> str | None:
            if tx.update(row_id, fast_expect, fast_changes):
                return token
            row = _load(tx, row_id, _CLAIM_COLUMNS)
            # completed_at is written together with the event, and is cheaper to read
            if row["delivery_state"] != PENDING or row["completed_at"] is None:
                return None
            if row["next_attempt_at"] > now:
                return None  # backing off after a release: a wait, not an attempt
            if row["claim_expires_at"] > now and not self.is_dead(row["holder"]):
                return None
            expect = {
                "delivery_state": PENDING,
                "claim_token": row["claim_token"],
                "delivery_attempts": row["delivery_attempts"],
            }
            if row["delivery_attempts"] >= policy.max_attempts:
                tx.update(row_id, expect, _settle(DROPPED, now, "attempt budget exhausted"))
                tx.audit(row_id, "drop", "attempt budget exhausted at claim", now)
                return None
            # The holder died holding a live claim: break it now, not at the lease's end.
            ok = tx.update(
                row_id, expect, {**claimed, "delivery_attempts": row["delivery_attempts"] + 1}
            )
            return token if ok else None

        return op

    def complete(self, row_id: str, token: str) -> bool:
        """Acknowledge a delivery; only the current claim's holder can."""
        return self.submit_complete(row_id, token).result()

    def submit_complete(self, row_id: str, token: str) -> WriteFuture[bool]:
        return self.backend.submit(self._complete_op(row_id, token), durable=False)

    async def acomplete(self, row_id: str, token: str) -> bool:
        return await self.backend.submit_async(self._complete_op(row_id, token), durable=False)

    def _complete_op(self, row_id: str, token: str) -> Callable[[LedgerTx], bool]:
        _check_id(row_id)
        _check_token(token)
        now = self.clock()
        changes = {**_settle(DELIVERED, now, "acknowledged by consumer"), "claim_token": token}

        def op(tx: LedgerTx) -> bool:
            if tx.update(row_id, {"claim_token": token, "delivery_state": PENDING}, changes):
                return True
            row = _load_held(tx, row_id, token)
            return row["delivery_state"] == DELIVERED  # a repeated ack is a no-op

        return op

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
        _check_id(row_id)
        _check_token(token)
        now = self.clock()
        replay_now = self.steady.replay_now(now)
        policy = self.policy
        identity = self.identity

        def op(tx: LedgerTx) -> tuple[str, float | None]:
            row = _load_held(tx, row_id, token)
            if row["delivery_state"] != PENDING:
                return row["delivery_state"], None
            attempts, refunds = row["delivery_attempts"], row["refunds"]
            if retryable:
                attempts, refunds = max(attempts - 1, 0), refunds + 1
            expect = {"claim_token": token, "delivery_state": PENDING}
            # Not ``now``: a wall clock stepped forward must not drop a fresh result.
            age = replay_now - (row["replay_from"] or row["completed_at"] or row["created_at"])
            reason = None
            if not retryable and attempts >= policy.max_attempts:
                reason = f"attempt budget of {policy.max_attempts} exhausted"
            elif age > policy.replay_cap_seconds:
                reason = "older than the replay age cap"
            if reason:
                tx.update(
                    row_id,
                    expect,
                    {
                        **_settle(DROPPED, now, reason),
                        "delivery_attempts": attempts,
                        "refunds": refunds,
                    },
                )
                tx.audit(row_id, "drop", reason, now)
                return DROPPED, None
            eligible = now + policy.retry_delay(attempts + refunds)
            tx.update(
                row_id,
                expect,
                {
                    "claim_token": None,
                    "claim_consumer": None,
                    "claim_expires_at": 0,
                    "delivery_attempts": attempts,
                    "refunds": refunds,
                    "next_attempt_at": eligible,
                    "due_at": eligible,
                    "holder": identity,
                    "updated_at": now,
                },
            )
            return PENDING, eligible

        return op

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

    def is_dead(self, identity: str | None) -> bool:
        """Provably gone: an exited process of this host, or a lapsed server of another."""
        return self.servers.is_dead(identity)

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

    # -- recovery -------------------------------------------------------------------------------

    def set_adopter(self, kind: str, adopt: Callable[[LedgerRow], None] | None) -> None:
        """Say who takes over the running rows of ``kind`` whose owner process died.

        Work of such a kind can outlive its owner (a background process keeps running after
        its server is killed). Instead of settling the row as ``unknown``, recovery makes
        this process its owner (a compare-and-set, so one survivor only) and hands the row
        to ``adopt``, which must finish it (``finish(expected="running")``) once its real
        outcome is known. ``adopt`` must not block; ``None`` removes the adopter.
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

    def recover_abandoned(self) -> list[dict[str, Any]]:
        """Queued/running rows whose owner process is gone get a completion that says so.

        queued -> interrupted (the work never started: safe to run again);
        running -> unknown (it may have had effects: the user must decide), unless its kind
        has an adopter (``set_adopter``): then this process takes the row over and the
        adopter reports its real outcome.
        """
        self.servers.refresh_liveness()
        recovered: list[dict[str, Any]] = []
        for state, new_state in ((State.QUEUED, State.INTERRUPTED), (State.RUNNING, State.UNKNOWN)):
            for owner in self.backend.active_owners(state):
                if owner == self.identity or not self.is_dead(owner):
                    continue
                for row in self.backend.rows_owned_by(owner, state, _SCAN_LIMIT):
                    adopt = self._adopters.get(row.kind) if state == State.RUNNING else None
                    if adopt is not None:
                        if self.take_over(row.id, owner):
                            try:
                                adopt(dataclasses.replace(row, owner=self.identity))
                                log.info(
                                    "recovered %s %s from dead server %s: taken over",
                                    row.kind,
                                    row.id,
                                    owner,
                                )
                                continue
                            except Exception:
                                log.exception("adopting %s failed", row.id)
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

    def restore(self) -> list[dict[str, Any]]:
        """After a restart: every pending completion, oldest first, marked as restored.

        Rows past the replay age cap are dropped instead of replayed; rows under a live
        claim of a live process are left to that process.
        """
        self.recover_abandoned()
        now = self.clock()
        return self._take(self.backend.pending_with_event(_SCAN_LIMIT), now, "restore")

    def take_due(self, now: float | None = None) -> list[dict[str, Any]]:
        """Pending rows whose due time has come, or whose holder died: offered again."""
        now = self.clock() if now is None else now
        rows = self.backend.due(now, _SCAN_LIMIT)
        for holder in self.backend.pending_holders():
            if holder != self.identity and self.is_dead(holder):
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
        return self._take(rows, now, "orphan")

    def _take(self, rows: list[LedgerRow], now: float, reason: str) -> list[dict[str, Any]]:
        policy, identity = self.policy, self.identity
        seen: set[str] = set()
        candidates = []
        for row in sorted(rows, key=lambda r: (r.completed_at or 0, r.id)):
            if row.id in seen or row.event is None:
                continue
            seen.add(row.id)
            candidates.append(row)

        if not candidates:
            return []
        return self.backend.write(
            reoffer_op(
                candidates,
                now,
                reason,
                policy,
                identity,
                self.servers.lapsed,
                replay_now=self.steady.replay_now(now),
            )
        )
