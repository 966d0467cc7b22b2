"""The completion events the ledger writes or re-offers on its own, not the work's.

``abandoned_event``: the completion of work whose owner process died before it finished
(recovery of abandoned work). ``mark_reoffered``: a copy of a stored event marked as offered
again (restore, orphan re-offer), so that no new, unrelated session adopts it.
``reoffer_op``: the one write of a restore or orphan re-offer; ``redeliver_op``: that of an
operator's redeliver. ``settle_changes``: what settles a row.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from delivery.backend import LedgerTx, Update
from delivery.errors import InvalidTransitionError, UnknownDeliveryError
from delivery.events import ASYNC_DELEGATION, PROCESS_COMPLETION
from delivery.identity import holder_is_dead
from delivery.json_types import JSONObject
from delivery.policy import DeliveryPolicy
from delivery.rows import LedgerRow
from delivery.states import DeliveryState, State


def mark_reoffered(event: JSONObject, reason: str, at: float, *, first: bool = False) -> JSONObject:
    """A copy of ``event`` marked as offered again (``restored`` and ``_restored`` True, the
    reason and the time), so no unrelated session adopts it. The stored event is unchanged.
    ``first``: no consumer ever took it before (``_first_offer``): a notice another process
    wrote (a cancel from the CLI) is offered by a server for the first time, so its wake-up
    must not say it is delivered again.

    The copy is shallow: ``event`` is one the ledger decoded from the store for this offer
    and keeps nothing of afterwards, so the offer may own its values. A deep copy cost a
    burst of ten thousand due timers a fifth of the writer's time spent offering them."""
    marked: JSONObject = dict(event)
    if first:
        marked["_first_offer"] = True
    # Both spellings: hermes' and hermes-webui's consumers read ``restored``, older ones here
    # ``_restored``; a consumer that misses the mark would let a new session adopt it.
    marked["restored"] = True
    marked["_restored"] = True
    marked["_reoffer_reason"] = reason
    marked["_reoffered_at"] = at
    return marked


def abandoned_event(row: LedgerRow, state: str, now: float) -> JSONObject:
    """The completion event of work whose owner process died before it finished."""
    request = dict(row.request or {})
    never_started = state == State.INTERRUPTED
    event = {
        **request,
        # the claim goes by these ids: never trust the stored request to carry them
        "delegation_id" if row.kind == "delegation" else "delivery_id": row.id,
        "status": str(state),
        "error": (
            "Reveille restarted before this work started; it never ran and can be dispatched again."
            if never_started
            else "Reveille stopped while this work was running; whether it finished or "
            "had effects is unknown."
        ),
        "completed_at": now,
        "abandoned": True,
    }
    event.setdefault("type", ASYNC_DELEGATION if row.kind == "delegation" else PROCESS_COMPLETION)
    started = row.started_at or row.created_at
    if started:
        event["duration_seconds"] = round(max(now - started, 0.0), 3)
    return event


_PENDING = DeliveryState.PENDING.value
_DROPPED = DeliveryState.DROPPED.value
# What a re-offer does with a row it compare-and-sets: offers it, drops it as too old,
# moves its due time to the end of the live claim on it, or takes over a dead process's row
# that waits for its due time.
_OFFER, _DROP, _LATER, _ADOPT = "offer", "drop", "later", "adopt"


def settle_changes(state: str, now: float, reason: str) -> JSONObject:
    """The changes that settle a pending row as ``state`` (delivered or dropped)."""
    return {
        "delivery_state": state,
        "settled_at": now,
        "settled_reason": reason,
        "claim_expires_at": 0,
        "due_at": None,
        "holder": None,
        "updated_at": now,
    }


def reoffer_op(
    candidates: list[LedgerRow],
    now: float,
    reason: str,
    policy: DeliveryPolicy,
    identity: str,
    lapsed: Collection[str] = (),
    *,
    replay_now: float | None = None,
) -> Callable[[LedgerTx], list[JSONObject]]:
    """The operation of a restore or orphan re-offer (``reason``) of ``candidates``.

    ``identity`` becomes the holder of each row it offers again; rows under a live claim of
    a live process or still backing off are left alone (except that a dead process's rows
    backing off become ``identity``'s); rows past the replay cap are dropped.
    Their age is measured from ``replay_now`` (default ``now``): the ledger's
    ``SteadyWall.replay_now``, which a wall clock stepped forward cannot move on.
    """
    age_now = now if replay_now is None else replay_now

    def op(tx: LedgerTx) -> list[JSONObject]:
        # Every compare-and-set is decided first and sent together (``update_many``: one
        # round trip on PostgreSQL for a pass over hundreds of due timers); the answers
        # then say which rows were offered and which drops to audit.
        free = tx.lock_free([row.id for row in candidates])
        updates: list[Update] = []
        taken: list[tuple[LedgerRow, str]] = []  # (row, _OFFER, _DROP, _LATER or _ADOPT)
        for row in candidates:
            if row.id not in free or row.event is None:
                continue  # another process is offering or settling it right now
            expect = {
                "delivery_state": _PENDING,
                "holder": row.holder,
                "due_at": row.due_at,
                "claim_token": row.claim_token,
            }
            if row.claim_expires_at > now and not holder_is_dead(row.holder, lapsed):
                # A live process holds a live claim: it is in flight. A claim leaves the due
                # time its offer set (``delivery.claims.claim_op``); come before the lease's
                # end, it moves there, so the row is not found due again pass after pass.
                if row.due_at is not None and row.due_at <= now:
                    updates.append((row.id, expect, {"due_at": row.claim_expires_at}))
                    taken.append((row, _LATER))
                continue
            if row.next_attempt_at > now:
                # Backing off (a timer not yet due, a release's retry): offered when its due
                # time comes, not before. Held by a dead process, it is this one's from now:
                # left to the dead, every pass would read it again as an orphan (a server
                # restarted with 90,000 timers read 10,000 of them, every few seconds).
                if row.holder != identity and holder_is_dead(row.holder, lapsed):
                    updates.append((row.id, expect, {"holder": identity, "updated_at": now}))
                    taken.append((row, _ADOPT))
                continue
            age = age_now - (row.replay_from or row.completed_at or row.created_at)
            if age > policy.replay_cap_seconds:
                too_old = settle_changes(_DROPPED, now, "older than the replay age cap")
                updates.append((row.id, expect, too_old))
                taken.append((row, _DROP))
                continue
            changes = {
                "holder": identity,
                "due_at": now + policy.lease_seconds,
                "restored": row.restored + 1,
                "updated_at": now,
            }
            if row.claim_expires_at:
                # The lease ran out, or its holder died: the claim is void now.
                changes.update(claim_token=None, claim_consumer=None, claim_expires_at=0)
            updates.append((row.id, expect, changes))
            taken.append((row, _OFFER))
        offered = []
        answers = tx.update_many(updates) if updates else []
        for (row, what), changed in zip(taken, answers, strict=True):
            if not changed or what in (_LATER, _ADOPT):
                continue
            if what == _DROP:
                tx.audit(row.id, "drop", f"not replayed on {reason}: too old", now)
            else:
                first = row.restored == 0 and row.delivery_attempts == 0
                assert row.event is not None
                offered.append(mark_reoffered(row.event, reason, now, first=first))
        return offered

    return op


def redeliver_op(
    row_id: str, now: float, identity: str, actor: str
) -> Callable[[LedgerTx], LedgerRow]:
    """The operation of an operator's redeliver: a dropped row goes back to pending with a
    fresh budget, held by ``identity``; the row as it is afterwards."""

    def op(tx: LedgerTx) -> LedgerRow:
        row = tx.get(row_id)
        if row is None:
            raise UnknownDeliveryError(f"no ledger row {row_id!r}")
        if row["delivery_state"] != _DROPPED:
            raise InvalidTransitionError(
                f"{row_id} is {row['delivery_state']}; only a dropped row can be redelivered"
            )
        if row["event"] is None:
            raise InvalidTransitionError(f"{row_id} has no completion event to deliver")
        changes = {
            "delivery_state": _PENDING,
            "delivery_attempts": 0,
            "refunds": 0,
            "next_attempt_at": 0,
            "claim_token": None,
            "claim_consumer": None,
            "claim_expires_at": 0,
            "settled_at": None,
            "settled_reason": None,
            "replay_from": now,
            "holder": identity,
            "due_at": now,
            "updated_at": now,
        }
        tx.update(row_id, {"delivery_state": _DROPPED}, changes)
        tx.audit(row_id, "redeliver", f"by {actor}; fresh budget", now)
        return LedgerRow(**{**row, **changes})

    return op
