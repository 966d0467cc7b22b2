"""The ledger as a state machine, checked against a simple in-memory model.

Hypothesis drives random sequences of create / start / finish / claim (by several consumers
in live, remote and dead processes) / complete / release / release(retryable) / drop /
redeliver / restore / take_due and clock moves (lease expiry, backoff, the replay cap) against
every backend (SQLite, in memory), and after every step checks that:

* the ledger's rows equal the model's (the model states the rules of SPEC.md plainly);
* no row is ever acknowledged twice (``complete`` moves a row to delivered at most once);
* a settled row (delivered / dropped) never becomes pending again, except by an explicit
  operator ``redeliver`` of a dropped row;
* ``delivery_attempts`` never exceeds the budget;

and at the end that no pending row is lost: once every lease and backoff has run out, each
pending completion is re-offered and claimable, or was dropped for a stated reason.

``REVEILLE_LEDGER_EXAMPLES`` raises the number of examples; ``REVEILLE_LEDGER_EXPLORE=1``
also turns off derandomisation so that every run explores new sequences.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from delivery.errors import ClaimMismatchError, InvalidTransitionError
from delivery.identity import current_identity
from delivery.ledger import Ledger
from delivery.policy import DeliveryPolicy
from delivery.states import ACTIVE_STATES, ALLOWED_TRANSITIONS
from tests.delivery._support import REMOTE_IDENTITY, FakeClock, exited_identity, make_backend

POLICY = DeliveryPolicy(
    lease_seconds=300.0,
    max_attempts=3,  # small, so that sequences reach the budget often
    replay_cap_seconds=48 * 3600.0,
    retry_base_seconds=2.0,
    retry_max_seconds=300.0,
)
MAX_ROWS = 6
# Around every lease and backoff edge, and close to the replay cap (two of those pass it).
CLOCK_STEPS = [0.5, 1.0, 2.0, 4.0, 8.0, 30.0, 150.0, 299.0, 300.0, 301.0, 600.0, 3600.0]
CLOCK_STEPS.append(48 * 3600.0 - 1000.0)
TERMINAL_EDGES = {
    src: sorted(str(s) for s in targets if s not in ACTIVE_STATES)
    for src, targets in ALLOWED_TRANSITIONS.items()
}
WHO = ["me", "remote", "dead"]


@dataclass
class MRow:
    """The model of one ledger row: only what the rules talk about."""

    owner: str
    state: str
    created_at: float
    delivery_state: str = "pending"
    has_event: bool = False
    token: str | None = None
    expires: float = 0.0
    holder: str | None = None
    attempts: int = 0
    refunds: int = 0
    next_at: float = 0.0
    due_at: float | None = None
    completed_at: float | None = None
    replay_from: float | None = None
    restored: int = 0
    tokens: list[str] = field(default_factory=list)  # every token ever issued for it
    acks: int = 0  # how often complete() moved it to delivered


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self, backend_kind: str = "sqlite") -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="ledger-sm-")
        self.backend = make_backend(backend_kind, Path(self.dir))
        self.clock = FakeClock()
        self.ident = {"me": str(current_identity()), "remote": REMOTE_IDENTITY}
        self.ident["dead"] = exited_identity()
        self.ledgers = {
            who: Ledger(self.backend, POLICY, clock=self.clock, identity=self.ident[who])
            for who in WHO
        }
        self.me = self.ledgers["me"]
        self.rows: dict[str, MRow] = {}
        self.settled_once: set[str] = set()  # ids the ledger has shown settled

    # -- model helpers --------------------------------------------------------------------

    def is_dead(self, identity: str | None) -> bool:
        return identity == self.ident["dead"]

    def now(self) -> float:
        return self.clock()

    def settle(self, row: MRow, state: str) -> None:
        row.delivery_state = state
        row.expires = 0.0
        row.due_at = None
        row.holder = None

    def model_finish(self, row: MRow, expected: str, new: str, by: str) -> bool:
        """True when there is a completion to queue now."""
        if row.state != expected:
            return False
        now = self.now()
        row.state = new
        row.has_event = True
        row.completed_at = row.replay_from = now
        if row.delivery_state != "pending":
            # Dropped while it ran: the result is kept, but nobody is to deliver it.
            event("finish: result of a dropped row recorded")
            return False
        row.holder = self.ident[by]
        row.due_at = now + POLICY.lease_seconds
        return True

    def model_take(self, candidates: list[str], by: str) -> list[str]:
        """The rules of re-offering (restore and take_due): which ids are offered, in order."""
        now = self.now()
        offered = []
        ordered = sorted(set(candidates), key=lambda i: (self.rows[i].completed_at or 0, i))
        for row_id in ordered:
            row = self.rows[row_id]
            if row.delivery_state != "pending" or not row.has_event:
                continue
            if row.expires > now and not self.is_dead(row.holder):
                if row.due_at is not None and row.due_at <= now:
                    row.due_at = row.expires  # due again at the live claim's end
                    event("re-offer: due time moved to a live claim's end")
                continue
            if row.next_at > now:
                # backing off: its due time brings it, not a restore; a dead holder's is ours
                if row.holder != self.ident[by] and self.is_dead(row.holder):
                    row.holder = self.ident[by]
                    event("re-offer: a dead holder's row adopted while it backs off")
                continue
            assert row.replay_from is not None
            if now - row.replay_from > POLICY.replay_cap_seconds:
                self.settle(row, "dropped")
                event("re-offer: dropped as too old")
                continue
            row.holder = self.ident[by]
            row.due_at = now + POLICY.lease_seconds
            row.restored += 1
            if row.expires:
                row.token, row.expires = None, 0.0
            offered.append(row_id)
            event("re-offer: offered")
        return offered

    def pick(self, data: st.DataObject, rows: list[str]) -> str:
        return data.draw(st.sampled_from(sorted(rows)), label="row")

    def pick_token(self, data: st.DataObject, row: MRow) -> str:
        if row.token is not None and data.draw(st.integers(0, 3), label="current"):
            return row.token  # mostly the current holder's token
        return data.draw(st.sampled_from([*row.tokens, "f" * 32]), label="token")

    # -- rules: the work's lifecycle --------------------------------------------------------

    @initialize(
        finished=st.lists(st.sampled_from(["me", "remote"]), min_size=1, max_size=3),
        active=st.lists(st.sampled_from(WHO), max_size=2),
    )
    def some_rows(self, finished: list[str], active: list[str]) -> None:
        """Start every run with completions waiting, so that steps go into delivering them."""
        for by in finished:
            self.create(by, True)
            row_id = f"r{len(self.rows) - 1}"
            event = {"type": "async_delegation", "delegation_id": row_id, "status": "completed"}
            assert self.ledgers[by].finish(
                row_id, expected="running", state="completed", event=event
            )
            assert self.model_finish(self.rows[row_id], "running", "completed", by)
        for i, by in enumerate(active):
            self.create(by, bool(i % 2))

    @precondition(lambda self: len(self.rows) < MAX_ROWS)
    @rule(by=st.sampled_from(WHO), running=st.booleans())
    def create(self, by: str, running: bool) -> None:
        row_id = f"r{len(self.rows)}"
        state = "running" if running else "queued"
        request = {"type": "async_delegation", "delegation_id": row_id}
        self.ledgers[by].create(row_id, kind="delegation", state=state, request=request)
        self.rows[row_id] = MRow(owner=self.ident[by], state=state, created_at=self.now())

    @precondition(lambda self: any(r.state == "queued" for r in self.rows.values()))
    @rule(data=st.data())
    def start(self, data: st.DataObject) -> None:
        row_id = self.pick(data, [i for i, r in self.rows.items() if r.state == "queued"])
        assert self.me.start(row_id) is True
        row = self.rows[row_id]
        row.state = "running"

    @precondition(lambda self: bool(self.rows))
    @rule(data=st.data(), by=st.sampled_from(["me", "remote"]), wrong=st.integers(0, 4))
    def finish(self, data: st.DataObject, by: str, wrong: int) -> None:
        active = [i for i, r in self.rows.items() if r.state in ("queued", "running")]
        row_id = self.pick(data, active if active and wrong else list(self.rows))
        state = self.rows[row_id].state
        if state not in ("queued", "running"):
            expected = "running"  # already finished: the compare-and-set finds nothing
        elif wrong:
            expected = state
        else:  # a compare-and-set that expects the wrong state must change nothing
            expected = "queued" if state == "running" else "running"
        new = data.draw(st.sampled_from(TERMINAL_EDGES[expected]), label="new")
        event = {"type": "async_delegation", "delegation_id": row_id, "status": new}
        got = self.ledgers[by].finish(row_id, expected=expected, state=new, event=event)
        assert got == self.model_finish(self.rows[row_id], expected, new, by)

    # -- rules: delivery --------------------------------------------------------------------

    def do_claim(self, row_id: str, by: str, consumer: str) -> str | None:
        row = self.rows[row_id]
        now = self.now()
        token = self.ledgers[by].claim(row_id, consumer)
        expect_token = True
        if (
            row.delivery_state != "pending"
            or not row.has_event
            or row.next_at > now
            or (row.expires > now and not self.is_dead(row.holder))
        ):
            expect_token = False
        elif row.attempts >= POLICY.max_attempts:
            self.settle(row, "dropped")
            expect_token = False
            event("claim: dropped at the budget")
        assert (token is not None) == expect_token, (row_id, row, now)
        if token is not None:
            broken = row.expires > now  # a live claim of a dead holder
            event(f"claim: won by {by}" + (" over a dead holder" if broken else ""))
            assert token not in row.tokens
            row.token = token
            row.tokens.append(token)
            row.attempts += 1
            row.expires = now + POLICY.lease_seconds
            row.holder = self.ident[by]
            if broken:
                row.due_at = row.expires  # else the due time the offer set stays
        return token

    def do_release(self, row_id: str, token: str, by: str, retryable: bool) -> None:
        row = self.rows[row_id]
        if token != row.token:
            before = self.backend.get(row_id)
            try:
                self.ledgers[by].release(row_id, token, retryable=retryable)
            except ClaimMismatchError:
                pass
            else:
                raise AssertionError(f"release with a stale token succeeded on {row_id}")
            assert self.backend.get(row_id) == before  # refused: nothing written
            return
        got = self.ledgers[by].release(row_id, token, retryable=retryable)
        if row.delivery_state != "pending":
            assert got == row.delivery_state
            return
        now = self.now()
        if retryable:
            row.attempts, row.refunds = max(row.attempts - 1, 0), row.refunds + 1
        assert row.replay_from is not None
        too_old = now - row.replay_from > POLICY.replay_cap_seconds
        if (not retryable and row.attempts >= POLICY.max_attempts) or too_old:
            self.settle(row, "dropped")
            event("release: dropped " + ("(too old)" if too_old else "(budget)"))
            assert got == "dropped"
            return
        assert got == "pending"
        event("release: pending again" + (" (refunded)" if retryable else ""))
        row.token, row.expires = None, 0.0
        row.next_at = row.due_at = now + POLICY.retry_delay(row.attempts + row.refunds)
        row.holder = self.ident[by]

    def pending_rows(self) -> list[str]:
        return [i for i, r in self.rows.items() if r.has_event and r.delivery_state == "pending"]

    @precondition(lambda self: bool(self.rows))
    @rule(
        data=st.data(),
        by=st.sampled_from(WHO),
        consumer=st.sampled_from(["webui", "gw"]),
        any_row=st.integers(0, 4),
    )
    def claim(self, data: st.DataObject, by: str, consumer: str, any_row: int) -> None:
        pending = self.pending_rows()
        self.do_claim(
            self.pick(data, pending if pending and any_row else list(self.rows)), by, consumer
        )

    def pick_claimed(self, data: st.DataObject) -> str:
        held = [i for i, r in self.rows.items() if r.token and r.delivery_state == "pending"]
        if held and data.draw(st.integers(0, 3), label="held"):
            return self.pick(data, held)
        return self.pick(data, [i for i, r in self.rows.items() if r.tokens])

    @precondition(lambda self: any(r.tokens for r in self.rows.values()))
    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        row_id = self.pick_claimed(data)
        row = self.rows[row_id]
        token = self.pick_token(data, row)
        if token != row.token:
            before = self.backend.get(row_id)
            try:
                self.me.complete(row_id, token)
            except ClaimMismatchError:
                pass
            else:
                raise AssertionError(f"complete with a stale token succeeded on {row_id}")
            assert self.backend.get(row_id) == before  # refused: nothing written
            return
        ok = self.me.complete(row_id, token)
        if row.delivery_state == "pending":
            assert ok is True
            event("complete: delivered")
            row.acks += 1
            self.settle(row, "delivered")
        else:  # a repeated ack of the same claim, or the row was dropped meanwhile
            assert ok == (row.delivery_state == "delivered")

    @precondition(lambda self: any(r.tokens for r in self.rows.values()))
    @rule(data=st.data(), by=st.sampled_from(WHO), retryable=st.booleans())
    def release(self, data: st.DataObject, by: str, retryable: bool) -> None:
        # by "dead": released, then its process died (its row backs off, held by the dead)
        row_id = self.pick_claimed(data)
        self.do_release(row_id, self.pick_token(data, self.rows[row_id]), by, retryable)

    @precondition(lambda self: bool(self.pending_rows()))
    @rule(data=st.data(), by=st.sampled_from(["me", "remote"]), retryable=st.booleans())
    def refusing_consumer(self, data: st.DataObject, by: str, retryable: bool) -> None:
        """A consumer that waits until it may claim, claims, and is refused (busy session)."""
        row_id = self.pick(data, self.pending_rows())
        row = self.rows[row_id]
        ready = max(row.next_at, 0.0 if self.is_dead(row.holder) else row.expires)
        if ready > self.now():
            self.clock.advance(ready - self.now())
        token = self.do_claim(row_id, by, "refuser")
        if token is not None:
            self.do_release(row_id, token, by, retryable)

    @precondition(lambda self: bool(self.rows))
    @rule(data=st.data(), with_token=st.booleans())
    def drop(self, data: st.DataObject, with_token: bool) -> None:
        """The target is gone (session deleted): any row, also one whose work still runs."""
        row_id = self.pick(data, list(self.rows))
        row = self.rows[row_id]
        token = row.token if with_token and row.token else None
        got = self.me.drop(row_id, "session deleted", token=token)
        assert got == (row.delivery_state == "pending")
        if got:
            self.settle(row, "dropped")

    @precondition(lambda self: any(r.delivery_state != "pending" for r in self.rows.values()))
    @rule(data=st.data())
    def redeliver(self, data: st.DataObject) -> None:
        """The operator's explicit way back: only a dropped row, with a fresh budget."""
        row_id = self.pick(data, [i for i, r in self.rows.items() if r.delivery_state != "pending"])
        row = self.rows[row_id]
        if row.delivery_state != "dropped" or not row.has_event:
            try:
                self.me.redeliver(row_id)
            except InvalidTransitionError:
                return
            raise AssertionError(f"redeliver of a {row.delivery_state} row succeeded")
        self.me.redeliver(row_id)
        event("redeliver")
        now = self.now()
        row.delivery_state = "pending"
        row.attempts = row.refunds = 0
        row.next_at = 0.0
        row.token, row.expires = None, 0.0
        row.replay_from = now
        row.holder = self.ident["me"]
        row.due_at = now
        self.settled_once.discard(row_id)

    # -- rules: re-offering and time -------------------------------------------------------

    def model_recover(self) -> None:
        for state, new in (("queued", "interrupted"), ("running", "unknown")):
            for row in self.rows.values():
                if row.state == state and row.owner != self.ident["me"] and self.is_dead(row.owner):
                    self.model_finish(row, state, new, "me")

    @rule()
    def restore(self) -> None:
        offered = [e["delegation_id"] for e in self.me.restore()]
        self.model_recover()
        candidates = [
            i for i, r in self.rows.items() if r.delivery_state == "pending" and r.has_event
        ]
        assert offered == self.model_take(candidates, "me")

    @rule()
    def take_due(self) -> None:
        now = self.now()
        offered = [e["delegation_id"] for e in self.me.take_due()]
        candidates = [
            i
            for i, r in self.rows.items()
            if r.delivery_state == "pending"
            and (
                (r.due_at is not None and r.due_at <= now)
                or (r.holder != self.ident["me"] and self.is_dead(r.holder))
            )
        ]
        assert offered == self.model_take(candidates, "me")

    @rule(seconds=st.sampled_from(CLOCK_STEPS))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def edges(self, row: MRow) -> list[float]:
        """Future times at which the rules change their answer for ``row``."""
        now = self.now()
        found = {e for e in (row.expires, row.next_at, row.due_at) if e is not None and e > now}
        return sorted(found)

    def rows_with_edges(self) -> list[str]:
        return [i for i, r in self.rows.items() if self.edges(r)]

    @precondition(lambda self: bool(self.rows_with_edges()))
    @rule(
        data=st.data(),
        offset=st.sampled_from([-0.001, 0.0, 0.001]),
        by=st.sampled_from(WHO),
        then_claim=st.booleans(),
    )
    def advance_to_an_edge(
        self, data: st.DataObject, offset: float, by: str, then_claim: bool
    ) -> None:
        """Stop just before, at, or just after a lease end or a backoff end (and claim)."""
        row_id = self.pick(data, self.rows_with_edges())
        edge = data.draw(st.sampled_from(self.edges(self.rows[row_id])), label="edge")
        self.clock.set(max(self.now(), edge + offset))
        if then_claim:
            self.do_claim(row_id, by, "edge")

    # -- invariants -----------------------------------------------------------------------------

    @invariant()
    def ledger_equals_model(self) -> None:
        for row_id, m in self.rows.items():
            row = self.backend.get(row_id)
            assert row is not None, f"{row_id} vanished"
            got = {
                "state": row.state,
                "delivery_state": row.delivery_state,
                "has_event": row.event is not None,
                "attempts": row.delivery_attempts,
                "refunds": row.refunds,
                "next_at": row.next_attempt_at,
                "expires": row.claim_expires_at,
                "holder": row.holder,
                "due_at": row.due_at,
                "restored": row.restored,
                "token": row.claim_token if row.delivery_state == "pending" else m.token,
            }
            want = {
                "state": m.state,
                "delivery_state": m.delivery_state,
                "has_event": m.has_event,
                "attempts": m.attempts,
                "refunds": m.refunds,
                "next_at": m.next_at,
                "expires": m.expires,
                "holder": m.holder,
                "due_at": m.due_at,
                "restored": m.restored,
                "token": m.token,
            }
            assert got == want, (row_id, got, want)

    @invariant()
    def never_delivered_twice_never_resurrected_budget_kept(self) -> None:
        for row_id, m in self.rows.items():
            row = self.backend.get(row_id)
            assert row is not None
            assert m.acks <= 1, f"{row_id} was acknowledged {m.acks} times"
            assert row.delivery_attempts <= POLICY.max_attempts
            if row.delivery_state != "pending":
                self.settled_once.add(row_id)
            elif row_id in self.settled_once:
                raise AssertionError(f"settled row {row_id} went back to pending")
            if m.acks:
                assert row.delivery_state == "delivered"

    # -- the end: nothing pending is lost ----------------------------------------------------

    def teardown(self) -> None:
        event(f"rows: {len(self.rows)}")
        try:
            if self.rows:
                self.check_nothing_pending_is_lost()
        finally:
            self.backend.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    def check_nothing_pending_is_lost(self) -> None:
        # Past every lease and backoff (each is at most 300 s; a re-offer adds one lease).
        self.clock.advance(POLICY.lease_seconds + POLICY.retry_max_seconds + 1)
        self.restore()
        self.ledger_equals_model()
        for row_id, m in self.rows.items():
            row = self.backend.get(row_id)
            assert row is not None
            if row.delivery_state != "pending":
                continue
            if row.event is None:
                # Work still running in a live process: not lost, it will finish.
                assert m.owner != self.ident["dead"] and m.state in ("queued", "running")
                continue
            token = self.me.claim(row_id, "final")
            after = self.backend.get(row_id)
            assert after is not None
            if token is None:
                # The only reason left: the budget was spent (dropped at this claim).
                assert after.delivery_state == "dropped", (row_id, row)
                assert row.delivery_attempts >= POLICY.max_attempts
            else:
                assert self.me.complete(row_id, token)


def _settings() -> settings:
    explore = os.environ.get("REVEILLE_LEDGER_EXPLORE") == "1"
    return settings(
        max_examples=int(os.environ.get("REVEILLE_LEDGER_EXAMPLES", "150")),
        stateful_step_count=50,
        deadline=None,
        derandomize=not explore,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        print_blob=True,
    )


def test_ledger_state_machine(backend_kind: str) -> None:
    """The machine over every backend (``backend_kind`` is the conformance fixture)."""
    run_state_machine_as_test(lambda: LedgerMachine(backend_kind), settings=_settings())


def test_model_helpers_are_consistent() -> None:
    """The model's edge table matches the lifecycle: every terminal edge is reachable."""
    assert TERMINAL_EDGES["queued"] == ["cancelled", "interrupted"]
    assert set(TERMINAL_EDGES["running"]) >= {"completed", "failed", "unknown", "error"}
