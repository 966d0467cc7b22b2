"""The ledger's claim rules, each an operation on ``LedgerTx`` (so every backend runs the
same rule): a claim under a lease within the attempt budget, its acknowledgement, and its
release (the attempt kept or refunded, the backoff, the budget and the replay age cap);
plus the id and token checks and the row loads every ledger rule starts with.

``delivery.ledger.Ledger`` builds these with its clock, policy and identity and submits
them to its backend.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from delivery.backend import AtMost, Below, Increment, IsSet, LedgerTx
from delivery.errors import ClaimMismatchError, UnknownDeliveryError
from delivery.ids import new_token
from delivery.policy import DeliveryPolicy
from delivery.recovery import settle_changes as _settle
from delivery.states import DeliveryState

__all__ = [
    "check_id",
    "check_token",
    "claim_op",
    "complete_op",
    "load",
    "load_held",
    "release_op",
]

PENDING = DeliveryState.PENDING.value
DELIVERED = DeliveryState.DELIVERED.value
DROPPED = DeliveryState.DROPPED.value

# Immutable markers every claim names: made once, not per claim (a burst makes thousands).
_IS_SET = IsSet()
_ONE_MORE = Increment(1)
_CLAIM_COLUMNS = (
    "delivery_state",
    "completed_at",
    "next_attempt_at",
    "claim_expires_at",
    "holder",
    "claim_token",
    "delivery_attempts",
)


def check_id(row_id: object) -> str:
    if not isinstance(row_id, str):
        raise TypeError(f"a ledger id must be a string, not {type(row_id).__name__}")
    if not row_id or len(row_id) > 200:
        raise ValueError("a ledger id must be 1 to 200 characters")
    return row_id


def check_token(token: object) -> str:
    if not isinstance(token, str) or not token:
        raise TypeError("a claim token must be the non-empty string claim() returned")
    return token


def load(tx: LedgerTx, row_id: str, columns: tuple[str, ...] | None = None) -> dict[str, Any]:
    row = tx.get(row_id, columns)
    if row is None:
        raise UnknownDeliveryError(f"no ledger row {row_id!r}")
    return row


def load_held(tx: LedgerTx, row_id: str, token: str | None) -> dict[str, Any]:
    """The row, provided ``token`` (when given) is its current claim's."""
    row = load(tx, row_id)
    if token is not None and row["claim_token"] != token:
        raise ClaimMismatchError(
            f"{row_id}: that claim token is not the current holder's "
            f"(delivery_state={row['delivery_state']}); nothing was written"
        )
    return row


def claim_op(
    row_id: str,
    consumer: str,
    now: float,
    policy: DeliveryPolicy,
    identity: str,
    is_dead: Callable[[str | None], bool],
) -> Callable[[LedgerTx], str | None]:
    """Claim ``row_id`` for ``consumer`` under a lease: its token, or None when the row is
    settled, not yet due, or held by a live holder (one whose ``is_dead`` is false)."""
    check_id(row_id)
    if not isinstance(consumer, str) or not consumer:
        raise TypeError("consumer must be a non-empty string naming who claims")
    token = new_token()
    expires = now + policy.lease_seconds
    # The common case leaves ``due_at`` as the offer set it, a lease from the offer (a claim
    # follows its offer within moments): with no indexed column changed, PostgreSQL updates
    # the row in place (a HOT update: no entry in any of its indexes), where a new due time
    # cost an entry in each. Should the claim outlive that due time, the re-offer that finds
    # the row due moves it to the lease's end (``delivery.recovery.reoffer_op``).
    claimed = {
        "claim_token": token,
        "claim_consumer": consumer,
        "claimed_at": now,
        "claim_expires_at": expires,
        "updated_at": now,
    }
    # One statement for the common case: pending, due, unclaimed, under the budget, and
    # already held by this process (which offered it). The holder is then expected rather
    # than written: a column an update names is an index entry rewritten on SQLite (the
    # holders' index), whether or not its value changes. A row another process holds takes
    # the path below, which makes this one its holder.
    lapsed = AtMost(now)  # immutable: one for both columns
    fast_expect = {
        "delivery_state": PENDING,
        "completed_at": _IS_SET,
        "next_attempt_at": lapsed,
        "claim_expires_at": lapsed,
        "delivery_attempts": Below(policy.max_attempts),
        "holder": identity,
    }
    fast_changes = {**claimed, "delivery_attempts": _ONE_MORE}

    def op(tx: LedgerTx) -> str | None:
        if tx.update(row_id, fast_expect, fast_changes):
            return token
        row = load(tx, row_id, _CLAIM_COLUMNS)
        # completed_at is written together with the event, and is cheaper to read
        if row["delivery_state"] != PENDING or row["completed_at"] is None:
            return None
        if row["next_attempt_at"] > now:
            return None  # backing off after a release: a wait, not an attempt
        if row["claim_expires_at"] > now and not is_dead(row["holder"]):
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
        # Another process held the row: this one holds it from here. Its holder died holding
        # a live claim: broken now, not at the lease's end (which is the row's due time from
        # here on).
        changes = {
            **claimed,
            "holder": identity,
            "delivery_attempts": row["delivery_attempts"] + 1,
        }
        if row["claim_expires_at"] > now:
            changes["due_at"] = expires
        ok = tx.update(row_id, expect, changes)
        return token if ok else None

    return op


def complete_op(row_id: str, token: str, now: float) -> Callable[[LedgerTx], bool]:
    """Acknowledge the delivery held by ``token``: settled delivered (a repeat is a no-op)."""
    check_id(row_id)
    check_token(token)
    changes = {**_settle(DELIVERED, now, "acknowledged by consumer"), "claim_token": token}

    def op(tx: LedgerTx) -> bool:
        if tx.update(row_id, {"claim_token": token, "delivery_state": PENDING}, changes):
            return True
        row = load_held(tx, row_id, token)
        return row["delivery_state"] == DELIVERED  # a repeated ack is a no-op

    return op


def release_op(
    row_id: str,
    token: str,
    retryable: bool,
    now: float,
    replay_now: float,
    policy: DeliveryPolicy,
    identity: str,
) -> Callable[[LedgerTx], tuple[str, float | None]]:
    """Give the claim ``token`` back: the row's delivery state afterwards, and when it is
    due again (None once settled). See ``Ledger.release``."""
    check_id(row_id)
    check_token(token)

    def op(tx: LedgerTx) -> tuple[str, float | None]:
        row = load_held(tx, row_id, token)
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
