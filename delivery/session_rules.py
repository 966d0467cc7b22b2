"""The session store's rules, written once for every backend (as ``delivery.ledger`` is for
the ledger): ids and tombstones, folding, turns, compaction, idempotency, turn leases and
their approvals, retention.

``SessionRules`` is the ``SessionBackend`` every dialect hands out: it runs each rule as one
transaction of the dialect's ``SessionTx`` on its ``SessionRows`` (``delivery.session_rows``).
Every rule reads what it decides on inside the transaction that writes, and checks before
it writes, so a refusal writes nothing on any backend. The rules themselves are stated on
``delivery.session_backend``'s protocols and proved by ``tests/sessions/`` on every backend.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from delivery.session_backend import (
    ApprovalRecord,
    ApprovalStatus,
    Compaction,
    IdempotencyRecord,
    MessageHit,
    MessageRecord,
    NewMessage,
    NewSession,
    PrefixSessions,
    SessionBackend,
    SessionGone,
    SessionRecord,
    SessionTaken,
    TurnLease,
    TurnStart,
)
from delivery.session_rows import SessionRows, SessionTx

__all__ = ["KEEP_DECIDED_SECONDS", "SessionRules"]

# Decided approvals are kept a day, so that deciding twice is told apart from an unknown id.
KEEP_DECIDED_SECONDS = 86400.0
T = TypeVar("T")


def _turn(session_id: str) -> str:
    """The lock of a session's turn lease (its approvals' too)."""
    return "turn:" + session_id


def _require_live(rows: SessionRows, session_id: str) -> None:
    if not rows.live(session_id):
        raise SessionGone(session_id)


def _insert_session(
    rows: SessionRows, session_id: str, new: NewSession, now: float, *, revive: bool
) -> None:
    """Create the session unless it is live. ``revive``: an explicit creation, which clears a
    tombstone; otherwise a tombstoned id raises SessionGone. ``new.exclusive``: a live one
    raises SessionTaken. Checks come before writes."""
    if rows.insert_new_session(session_id, new, now):
        return  # neither live nor tombstoned: nothing to check, and it is written
    state = rows.state(session_id)
    if state == "live":
        if new.exclusive:
            raise SessionTaken(session_id)
        return
    if state == "deleted":
        if not revive:
            raise SessionGone(session_id)
        rows.untombstone(session_id)
    rows.insert_session(session_id, new, now)


def _peek(rows: SessionRows, session_id: str) -> TurnStart | None:
    """A turn's start from a read alone, or None when a write must fold."""
    state = rows.state(session_id)
    if state != "live":
        return TurnStart(state)
    history = tuple(rows.transcript(session_id, live=True))
    if any(m.is_delivery and not m.folded for m in history):
        return None
    return TurnStart("live", history)


def _compaction_allowed(
    rows: SessionRows, session_id: str, compaction: Compaction, now: float
) -> bool:
    lease = rows.lease(session_id)
    if lease is None or lease.stream_id != compaction.stream_id or lease.expires_at <= now:
        return False  # not under this caller's lease: another turn may be running
    wanted = set(compaction.archive_ids)
    if not wanted or not rows.live(session_id):
        return False
    found = rows.messages_by_id(session_id, sorted(wanted))
    if len(found) != len(wanted):
        return False  # another session's row, or one retention removed
    for m in found:
        if m.archived:
            return False  # compacted meanwhile (a retry after a crash finds this)
        if m.is_delivery and not (m.folded and m.seen):
            return False  # a result no stored turn has seen stays verbatim
    return True


class SessionRules:
    """``SessionBackend`` over a dialect's transactions (see the module docstring)."""

    def __init__(self, tx: SessionTx, clock: Callable[[], float]) -> None:
        self._tx = tx
        self._clock = clock

    @property
    def tx(self) -> SessionTx:
        return self._tx

    @property
    def url(self) -> str:
        return self._tx.url

    def stats(self) -> dict[str, int]:
        return self._tx.stats()

    def close(self) -> None:
        self._tx.close()

    # -- sessions

    async def acreate_session(self, session_id: str, new: NewSession) -> SessionRecord:
        return await self._tx.awrite((session_id,), self._creation(session_id, new))

    def create_session(self, session_id: str, new: NewSession) -> SessionRecord:
        return self._tx.write((session_id,), self._creation(session_id, new))

    def _creation(self, session_id: str, new: NewSession) -> Callable[[SessionRows], SessionRecord]:
        now = self._clock()

        def op(rows: SessionRows) -> SessionRecord:
            fresh = not rows.live(session_id)
            _insert_session(rows, session_id, new, now, revive=True)
            if fresh and new.metadata_json is not None:
                rows.set_metadata(session_id, new.metadata_json)
            if fresh and new.messages:
                rows.insert_messages(session_id, new.messages, now)
            found = rows.session(session_id)
            assert found is not None
            return found

        return op

    def get_session(self, session_id: str) -> SessionRecord | None:
        return self._tx.read(lambda rows: rows.session(session_id))

    def list_sessions(self, limit: int, offset: int) -> list[SessionRecord]:
        return self._tx.read(lambda rows: rows.sessions(limit, offset))

    def find_session_by_key(self, session_key: str) -> SessionRecord | None:
        return self._tx.read(lambda rows: rows.session_by_key(session_key))

    async def asessions_by_prefix(self, prefix: str, limit: int) -> PrefixSessions:
        def op(rows: SessionRows) -> PrefixSessions:
            ids, tombstoned = rows.prefix_ids(prefix, limit)
            transcripts = tuple((sid, tuple(rows.transcript(sid, live=False))) for sid in ids)
            return PrefixSessions(transcripts, prefix not in ids and tombstoned)

        return await self._tx.aread(op)

    async def aset_title(self, session_id: str, title: str, *, if_untitled: bool) -> bool:
        return await self._tx.awrite(
            (session_id,), lambda rows: rows.set_title(session_id, title, if_untitled=if_untitled)
        )

    async def aset_system_prompt(self, session_id: str, prompt: str | None) -> bool:
        return await self._tx.awrite(
            (session_id,), lambda rows: rows.set_system_prompt(session_id, prompt)
        )

    async def aset_metadata(self, session_id: str, metadata_json: str | None) -> bool:
        return await self._tx.awrite(
            (session_id,), lambda rows: rows.set_metadata(session_id, metadata_json)
        )

    def delete_session(self, session_id: str) -> bool:
        now = self._clock()

        def op(rows: SessionRows) -> bool:
            rows.tombstone(session_id, now)
            return rows.delete_session(session_id)

        return self._tx.write((session_id,), op)

    def supersede(self, session_id: str, ids: Sequence[int], how: str) -> int:
        def op(rows: SessionRows) -> int:
            _require_live(rows, session_id)
            return rows.supersede(session_id, sorted(set(ids)), how)

        return self._tx.write((session_id,), op)

    # -- messages and search

    def search_messages(self, terms: Sequence[str], limit: int) -> list[MessageHit]:
        return self._tx.read(lambda rows: rows.search(terms, limit))

    def append_message(self, session_id: str, message: NewMessage) -> MessageRecord:
        now = self._clock()

        def op(rows: SessionRows) -> MessageRecord:
            _require_live(rows, session_id)
            out = rows.insert_message(session_id, message, now)
            rows.touch(session_id, now)
            return out

        return self._tx.write((session_id,), op)

    def messages(self, session_id: str, after_id: int, limit: int | None) -> list[MessageRecord]:
        def op(rows: SessionRows) -> list[MessageRecord]:
            _require_live(rows, session_id)
            return rows.messages_after(session_id, after_id, limit)

        return self._tx.read(op)

    def messages_before(self, session_id: str, before_id: int, limit: int) -> list[MessageRecord]:
        def op(rows: SessionRows) -> list[MessageRecord]:
            _require_live(rows, session_id)
            return rows.messages_before(session_id, before_id, limit)

        return self._tx.read(op)

    # -- turns

    async def abegin_turn(self, session_id: str, create: NewSession | None) -> TurnStart:
        # With nothing to fold or create a turn only reads: no trip to the writer.
        peek = await self._tx.aread(lambda rows: _peek(rows, session_id))
        if peek is not None and (peek.state == "live" or create is None):
            return peek
        now = self._clock()

        def op(rows: SessionRows) -> TurnStart:
            # Read again inside the write: a racing turn may have folded meanwhile, and the
            # transaction makes this turn's take disjoint from every other one.
            state = rows.state(session_id)
            if state != "live":
                if create is None:
                    return TurnStart(state)
                _insert_session(rows, session_id, create, now, revive=True)
            history = tuple(rows.transcript(session_id, live=True))
            upto = history[-1].id if history else 0
            taken = tuple(m.as_folded() for m in rows.fold(session_id, upto, now))
            return TurnStart(state, history, taken)

        return await self._tx.awrite((session_id,), op)

    async def aappend_turn(
        self,
        session_id: str,
        messages: Sequence[NewMessage],
        *,
        create: NewSession | None = None,
        idempotency_key: str | None = None,
        response_json: str | None = None,
        seen: Sequence[int] = (),
    ) -> None:
        now = self._clock()

        def op(rows: SessionRows) -> None:
            if create is not None:
                # Live once this returns (found live, or inserted under the session's lock):
                # asking again would only cost PostgreSQL a trip.
                _insert_session(rows, session_id, create, now, revive=False)
            else:
                _require_live(rows, session_id)
            if messages:
                rows.insert_messages(session_id, messages, now)
            rows.touch(session_id, now)
            if idempotency_key is not None:
                rows.finish_idempotency(idempotency_key, session_id, response_json, now)
            if seen:
                rows.mark_seen(session_id, sorted(set(seen)), now)

        await self._tx.awrite((session_id,), op)

    async def acompact(self, session_id: str, compaction: Compaction) -> MessageRecord | None:
        now = self._clock()

        def op(rows: SessionRows) -> MessageRecord | None:
            if not _compaction_allowed(rows, session_id, compaction, now):
                return None
            summary = rows.insert_message(session_id, compaction.summary, now)
            rows.archive(session_id, sorted(set(compaction.archive_ids)), summary.id, now)
            return summary

        # The session's lock (no fold, append or delete of it interleaves), then the
        # lease's: no take-over between the lease check and the commit.
        return await self._tx.awrite((session_id, _turn(session_id)), op)

    # -- idempotency

    def claim_idempotent(
        self,
        key: str,
        owner: str,
        session_id: str | None,
        takeover: Callable[[str], bool] | None,
    ) -> tuple[IdempotencyRecord, bool]:
        now = self._clock()

        def op(rows: SessionRows) -> tuple[IdempotencyRecord, bool]:
            found = rows.idempotency(key)
            if found is not None and not (
                found.state == "running"
                and found.owner != owner
                and takeover is not None
                and takeover(found.owner or "")
            ):
                return found, found.owner == owner
            rows.claim_idempotency(key, owner, session_id, now)
            claimed = rows.idempotency(key)
            assert claimed is not None
            return claimed, True

        return self._tx.write(("idem:" + key,), op)

    def release_idempotent(self, key: str, owner: str) -> bool:
        def op(rows: SessionRows) -> bool:
            found = rows.idempotency(key)
            if found is None or found.state != "running" or found.owner != owner:
                return False
            rows.delete_idempotency(key)
            return True

        return self._tx.write(("idem:" + key,), op)

    # -- running turns (leases) and their approvals

    def take_turn(
        self,
        session_id: str,
        stream_id: str,
        owner: str,
        *,
        wakeup: bool,
        ttl_seconds: float,
        is_dead: Callable[[str], bool],
    ) -> TurnLease:
        now = self._clock()
        lease = TurnLease(session_id, stream_id, owner, wakeup, now, now + ttl_seconds)

        def op(rows: SessionRows) -> TurnLease:
            held = rows.lease(session_id)
            if held is not None:
                if held.expires_at > now and not is_dead(held.owner):
                    return held
                rows.deny_pending(session_id, held.stream_id)  # the broken turn's asks
            rows.put_lease(lease)
            return lease

        return self._tx.write((_turn(session_id),), op)

    def renew_turn(self, session_id: str, stream_id: str, ttl_seconds: float) -> bool:
        until = self._clock() + ttl_seconds
        return self._tx.write(
            (_turn(session_id),), lambda rows: rows.extend_lease(session_id, stream_id, until)
        )

    def end_turn(self, session_id: str, stream_id: str) -> bool:
        def op(rows: SessionRows) -> bool:
            rows.deny_pending(session_id, stream_id)
            return rows.drop_lease(session_id, stream_id)

        return self._tx.write((_turn(session_id),), op)

    def running_turns(self) -> list[TurnLease]:
        now = self._clock()
        return self._tx.read(lambda rows: rows.leases(now))

    def ask_approval(self, approval: ApprovalRecord) -> bool:
        def op(rows: SessionRows) -> bool:
            if not approval.background:
                held = rows.lease(approval.session_id)
                if (
                    held is None
                    or held.stream_id != approval.stream_id
                    or held.expires_at <= approval.created_at
                ):
                    return False
            rows.forget_decided(approval.created_at - KEEP_DECIDED_SECONDS)
            rows.insert_approval(approval)
            return True

        # A background unit's holds no session: it need not wait on the session's lock.
        locks = () if approval.background else (_turn(approval.session_id),)
        return self._tx.write(locks, op)

    def _settle(
        self, approval_id: str, status: ApprovalStatus, answer: str = ""
    ) -> tuple[ApprovalRecord, bool]:
        def op(rows: SessionRows) -> tuple[ApprovalRecord, bool]:
            decided = rows.settle_approval(approval_id, status, answer)
            found = rows.approval(approval_id)
            if found is None:
                raise KeyError(approval_id)
            return found, decided

        return self._tx.write(("approval:" + approval_id,), op)

    def decide_approval(
        self, approval_id: str, approve: bool, answer: str = ""
    ) -> tuple[ApprovalRecord, bool]:
        if approve:
            return self._settle(approval_id, "approved", answer)
        return self._settle(approval_id, "denied")

    def expire_approval(self, approval_id: str) -> tuple[ApprovalRecord, bool]:
        return self._settle(approval_id, "expired")

    def pending_unit_approvals(self) -> list[ApprovalRecord]:
        return self._tx.read(lambda rows: rows.pending_units())

    def get_approval(self, approval_id: str) -> ApprovalRecord | None:
        return self._tx.read(lambda rows: rows.approval(approval_id))

    def pending_approval(self, session_id: str) -> ApprovalRecord | None:
        now = self._clock()

        def op(rows: SessionRows) -> ApprovalRecord | None:
            held = rows.lease(session_id)
            if held is None or held.expires_at <= now:
                return None
            return rows.pending_of(session_id, held.stream_id)

        return self._tx.read(op)

    def approval_counts(self) -> dict[str, int]:
        return self._tx.read(lambda rows: rows.approval_counts())

    # -- retention: pick, then (unless a dry run) delete what was picked, in one transaction

    def _prune(
        self,
        pick: Callable[[SessionRows], Sequence[T]],
        forget: Callable[[SessionRows, Sequence[T]], int],
        dry_run: bool,
    ) -> int:
        if dry_run:
            return self._tx.read(lambda rows: len(pick(rows)))
        return self._tx.write((), lambda rows: forget(rows, pick(rows)))

    def prune_idempotency(self, before: float, limit: int, *, dry_run: bool = False) -> int:
        return self._prune(
            lambda rows: rows.old_idempotency(before, int(limit)),
            lambda rows, keys: rows.forget_idempotency(keys) if keys else 0,
            dry_run,
        )

    def prune_tombstones(self, before: float, limit: int, *, dry_run: bool = False) -> int:
        return self._prune(
            lambda rows: rows.old_tombstones(before, int(limit)),
            lambda rows, ids: rows.forget_tombstones(ids) if ids else 0,
            dry_run,
        )

    def prune_archived_messages(self, before: float, limit: int, *, dry_run: bool = False) -> int:
        return self._prune(
            lambda rows: rows.old_archived(before, int(limit)),
            lambda rows, ids: rows.delete_messages(ids) if ids else 0,
            dry_run,
        )

    def unfolded_deliveries(self, wanted: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        if not wanted:
            return set()
        return self._tx.read(lambda rows: rows.unfolded_by_dedupe(wanted))


# mypy proves the rules keep the protocol, without importing it at run time.
if TYPE_CHECKING:
    _conforms: type[SessionBackend] = SessionRules
