"""An in-memory ``SessionBackend``: the SQLite backend's semantics, nothing on disk.

For tests and for embedding where no transcript must outlive the process. Every operation
runs under one lock and checks everything before it changes anything, so an operation that
raises has changed nothing (what a SQLite transaction gives). JSON values are kept as their
stored text and decoded on every read, so callers never share the store's objects and get
back exactly what SQLite would return. Coroutine variants run inline: each operation is a
few dictionary steps under an uncontended lock, cheaper than a thread hop.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
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
    SessionState,
    SessionStoreError,
    SessionTaken,
    TurnLease,
    TurnStart,
    decode_json,
    encode_json,
    mark_snippet,
)

T = TypeVar("T")
_stores = itertools.count(1)
_KEEP_DECIDED_SECONDS = 86400.0  # as long as the SQL backends keep a decided approval


@dataclass(slots=True)
class _Message:
    id: int
    role: str
    content: str
    created_at: float
    display_kind: str | None
    metadata_json: str | None
    dedupe_key: str | None
    folded_at: float | None = None
    seen_at: float | None = None
    archived_at: float | None = None
    summary_id: int | None = None

    def record(self) -> MessageRecord:
        return MessageRecord(
            id=self.id,
            role=self.role,
            content=self.content,
            created_at=self.created_at,
            display_kind=self.display_kind,
            display_metadata=decode_json(self.metadata_json),
            folded=self.folded_at is not None,
            seen=self.seen_at is not None,
            archived=self.archived_at is not None,
            summary_id=self.summary_id,
        )


@dataclass(slots=True)
class _Session:
    id: str
    source_json: str | None
    session_key: str | None
    title: str | None
    created_at: float
    updated_at: float
    messages: list[_Message] = field(default_factory=list)
    system_prompt: str | None = None
    by_dedupe: dict[str, _Message] = field(default_factory=dict)

    def record(self) -> SessionRecord:
        return SessionRecord(
            id=self.id,
            source=decode_json(self.source_json),
            session_key=self.session_key,
            title=self.title,
            created_at=self.created_at,
            updated_at=self.updated_at,
            system_prompt=self.system_prompt,
        )


@dataclass(slots=True)
class _Idem:
    key: str
    state: str
    owner: str | None
    session_id: str | None
    response_json: str | None
    created_at: float
    updated_at: float

    def record(self) -> IdempotencyRecord:
        return IdempotencyRecord(
            key=self.key,
            state="done" if self.state == "done" else "running",
            owner=self.owner,
            session_id=self.session_id,
            response=decode_json(self.response_json),
            created_at=self.created_at,
            updated_at=self.updated_at,
        )


def _live(s: _Session) -> tuple[MessageRecord, ...]:
    """What a turn reads: the transcript less the rows a compaction archived."""
    return tuple(m.record() for m in s.messages if m.archived_at is None)


def _recency(s: _Session) -> tuple[float, str]:
    return (-s.updated_at, s.id)


class MemorySessions:
    """``SessionBackend`` in this process's memory (see the module docstring)."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.RLock()
        self._closed = False
        self._sessions: dict[str, _Session] = {}
        self._tombstones: dict[str, float] = {}
        self._idem: dict[str, _Idem] = {}
        self._turns: dict[str, TurnLease] = {}
        self._approvals: dict[str, ApprovalRecord] = {}
        self._next_id = itertools.count(1)  # store-wide, never reused (like AUTOINCREMENT)
        self._writes = 0
        self._url = f"memory://sessions-{next(_stores)}"

    @property
    def url(self) -> str:
        return self._url

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"writes": self._writes}

    def close(self) -> None:
        with self._lock:
            self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise SessionStoreError(f"session store {self._url} is closed")

    def _write(self, op: Callable[[], T]) -> T:
        with self._lock:
            self._check_open()
            out = op()  # raises before it changes anything, so nothing to undo
            self._writes += 1
            return out

    def _read(self, op: Callable[[], T]) -> T:
        with self._lock:
            self._check_open()
            return op()

    def _live(self, session_id: str) -> _Session:
        s = self._sessions.get(session_id)
        if s is None:
            raise SessionGone(session_id)
        return s

    def _state(self, session_id: str) -> SessionState:
        if session_id in self._sessions:
            return "live"
        return "deleted" if session_id in self._tombstones else "unknown"

    def _insert_session(
        self, session_id: str, new: NewSession, now: float, *, revive: bool
    ) -> _Session:
        if session_id in self._sessions:
            if new.exclusive:
                raise SessionTaken(session_id)
            return self._sessions[session_id]
        if not revive and session_id in self._tombstones:
            raise SessionGone(session_id)
        self._tombstones.pop(session_id, None)
        s = _Session(session_id, new.source_json, new.session_key, new.title, now, now)
        self._sessions[session_id] = s
        return s

    @staticmethod
    def _find(s: _Session, m: NewMessage) -> _Message | None:
        return s.by_dedupe.get(m.dedupe_key) if m.dedupe_key is not None else None

    def _insert_message(self, s: _Session, m: NewMessage, now: float) -> _Message:
        found = self._find(s, m)
        if found is not None:
            return found
        row = _Message(
            id=next(self._next_id),
            role=m.role,
            content=m.content,
            created_at=now,
            display_kind=m.display_kind,
            metadata_json=m.metadata_json,
            dedupe_key=m.dedupe_key,
        )
        s.messages.append(row)
        if m.dedupe_key is not None:
            s.by_dedupe[m.dedupe_key] = row
        return row

    @staticmethod
    def _fold(s: _Session, now: float) -> tuple[MessageRecord, ...]:
        taken = [m for m in s.messages if m.display_kind is not None and m.folded_at is None]
        for m in taken:
            m.folded_at = now
        return tuple(m.record() for m in taken)

    # -- sessions

    def create_session(self, session_id: str, new: NewSession) -> SessionRecord:
        now = self._clock()
        return self._write(lambda: self._insert_session(session_id, new, now, revive=True).record())

    async def acreate_session(self, session_id: str, new: NewSession) -> SessionRecord:
        return self.create_session(session_id, new)

    def get_session(self, session_id: str) -> SessionRecord | None:
        def op() -> SessionRecord | None:
            s = self._sessions.get(session_id)
            return s.record() if s is not None else None

        return self._read(op)

    def list_sessions(self, limit: int, offset: int) -> list[SessionRecord]:
        def op() -> list[SessionRecord]:
            ordered = sorted(self._sessions.values(), key=_recency)
            return [s.record() for s in ordered[offset : offset + limit]]

        return self._read(op)

    def find_session_by_key(self, session_key: str) -> SessionRecord | None:
        def op() -> SessionRecord | None:
            hits = [s for s in self._sessions.values() if s.session_key == session_key]
            return min(hits, key=_recency).record() if hits else None

        return self._read(op)

    async def asessions_by_prefix(self, prefix: str, limit: int) -> PrefixSessions:
        def op() -> PrefixSessions:
            hits = sorted(
                (
                    s
                    for sid, s in self._sessions.items()
                    if sid == prefix or sid.startswith(prefix + "_")
                ),
                key=lambda s: (s.created_at, s.id),
            )[:limit]
            return PrefixSessions(
                tuple((s.id, tuple(m.record() for m in s.messages)) for s in hits),
                prefix not in self._sessions and prefix in self._tombstones,
            )

        return self._read(op)

    async def aset_title(self, session_id: str, title: str, *, if_untitled: bool) -> bool:
        def op() -> bool:
            s = self._sessions.get(session_id)
            if s is None or (if_untitled and s.title is not None):
                return False
            s.title = title
            return True

        return self._write(op)

    async def aset_system_prompt(self, session_id: str, prompt: str | None) -> bool:
        def op() -> bool:
            s = self._sessions.get(session_id)
            if s is None:
                return False
            s.system_prompt = prompt
            return True

        return self._write(op)

    def delete_session(self, session_id: str) -> bool:
        now = self._clock()

        def op() -> bool:
            self._tombstones[session_id] = now
            return self._sessions.pop(session_id, None) is not None

        return self._write(op)

    # -- messages

    def append_message(self, session_id: str, message: NewMessage) -> MessageRecord:
        now = self._clock()

        def op() -> MessageRecord:
            s = self._live(session_id)
            row = self._insert_message(s, message, now)
            s.updated_at = now
            return row.record()

        return self._write(op)

    def messages(self, session_id: str, after_id: int, limit: int | None) -> list[MessageRecord]:
        def op() -> list[MessageRecord]:
            rows = [m for m in self._live(session_id).messages if m.id > after_id]
            return [m.record() for m in (rows if limit is None else rows[:limit])]

        return self._read(op)

    def messages_before(self, session_id: str, before_id: int, limit: int) -> list[MessageRecord]:
        def op() -> list[MessageRecord]:
            rows = [m for m in self._live(session_id).messages if m.id < before_id]
            return [m.record() for m in rows[len(rows) - limit :]] if limit else []

        return self._read(op)

    def supersede(self, session_id: str, ids: Sequence[int], how: str) -> int:
        def op() -> int:
            wanted = set(ids)
            rows = [
                m for m in self._live(session_id).messages if m.id in wanted and not m.display_kind
            ]
            for m in rows:
                meta = decode_json(m.metadata_json) or {}
                m.metadata_json = encode_json({**meta, "superseded": how})
            return len(rows)

        return self._write(op)

    # -- search

    def search_messages(self, terms: Sequence[str], limit: int) -> list[MessageHit]:
        def op() -> list[MessageHit]:
            rows = sorted(
                ((s.id, m) for s in self._sessions.values() for m in s.messages),
                key=lambda pair: -pair[1].id,
            )
            hits: list[MessageHit] = []
            for session_id, m in rows:
                snippet = mark_snippet(m.content, terms)
                if snippet is not None:
                    hits.append(MessageHit(session_id, m.id, m.role, m.created_at, snippet))
                    if len(hits) >= limit:
                        break
            return hits

        return self._read(op)

    # -- turns

    async def abegin_turn(self, session_id: str, create: NewSession | None) -> TurnStart:
        now = self._clock()
        with self._lock:
            self._check_open()
            state = self._state(session_id)
            if state != "live" and create is None:
                return TurnStart(state)
            s = self._sessions.get(session_id)
            if s is not None and not any(
                m.display_kind is not None and m.folded_at is None for m in s.messages
            ):
                # Nothing to fold: a read, like SQLite's reader path (no write counted).
                return TurnStart(state, _live(s))

            def op() -> TurnStart:
                live = (
                    self._insert_session(session_id, create, now, revive=True)
                    if (create is not None)
                    else self._live(session_id)
                )
                return TurnStart(state, _live(live), self._fold(live, now))

            return self._write(op)

    def append_turn(
        self,
        session_id: str,
        messages: Sequence[NewMessage],
        *,
        create: NewSession | None = None,
        idempotency_key: str | None = None,
        response_json: str | None = None,
        seen: Sequence[int] = (),
    ) -> list[MessageRecord]:
        now = self._clock()

        def op() -> list[MessageRecord]:
            if create is not None:
                s = self._insert_session(session_id, create, now, revive=False)
            else:
                s = self._live(session_id)
            rows = [self._insert_message(s, m, now).record() for m in messages]
            s.updated_at = now
            if idempotency_key is not None:
                self._put(idempotency_key, response_json, session_id, now)
            wanted = set(seen)
            for m in s.messages:
                if m.id in wanted and m.seen_at is None and m.folded_at is not None:
                    m.seen_at = now
            return rows

        return self._write(op)

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
        self.append_turn(
            session_id,
            messages,
            create=create,
            idempotency_key=idempotency_key,
            response_json=response_json,
            seen=seen,
        )

    async def acompact(self, session_id: str, compaction: Compaction) -> MessageRecord | None:
        now = self._clock()

        def allowed(s: _Session | None) -> bool:
            held = self._turns.get(session_id)
            if s is None or held is None or held.stream_id != compaction.stream_id:
                return False
            if held.expires_at <= now:
                return False
            wanted = set(compaction.archive_ids)
            rows = [m for m in s.messages if m.id in wanted]
            return (
                bool(wanted)
                and len(rows) == len(wanted)
                and all(
                    m.archived_at is None
                    and (
                        m.display_kind is None
                        or (m.folded_at is not None and m.seen_at is not None)
                    )
                    for m in rows
                )
            )

        def op() -> MessageRecord | None:
            s = self._sessions.get(session_id)
            if s is None or not allowed(s):
                return None
            summary = self._insert_message(s, compaction.summary, now)
            wanted = set(compaction.archive_ids)
            for m in s.messages:
                if m.id in wanted:
                    m.archived_at, m.summary_id = now, summary.id
            return summary.record()

        return self._write(op)

    # -- idempotency

    def claim_idempotent(
        self,
        key: str,
        owner: str,
        session_id: str | None,
        takeover: Callable[[str], bool] | None,
    ) -> tuple[IdempotencyRecord, bool]:
        now = self._clock()

        def op() -> tuple[IdempotencyRecord, bool]:
            row = self._idem.get(key)
            if row is not None and not (
                row.state == "running"
                and row.owner != owner
                and takeover is not None
                and takeover(row.owner or "")
            ):
                return row.record(), row.owner == owner
            if row is None:
                row = self._idem[key] = _Idem(key, "running", owner, session_id, None, now, now)
            else:
                row.state, row.owner, row.session_id = "running", owner, session_id
                row.updated_at = now
            return row.record(), True

        return self._write(op)

    def _put(self, key: str, response_json: str | None, session_id: str | None, now: float) -> None:
        row = self._idem.get(key)
        if row is None:
            self._idem[key] = _Idem(key, "done", None, session_id, response_json, now, now)
        else:
            row.state, row.owner, row.session_id = "done", None, session_id
            row.response_json, row.updated_at = response_json, now

    def release_idempotent(self, key: str, owner: str) -> bool:
        def op() -> bool:
            row = self._idem.get(key)
            if row is None or row.state != "running" or row.owner != owner:
                return False
            del self._idem[key]
            return True

        return self._write(op)

    # -- running turns and their approvals

    def _deny_pending(self, session_id: str, stream_id: str) -> None:
        for a in list(self._approvals.values()):
            if a.session_id == session_id and a.stream_id == stream_id and a.status == "pending":
                self._approvals[a.id] = replace(a, status="denied")

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

        def op() -> TurnLease:
            held = self._turns.get(session_id)
            if held is not None and held.expires_at > now and not is_dead(held.owner):
                return held
            if held is not None:
                self._deny_pending(session_id, held.stream_id)
            lease = TurnLease(session_id, stream_id, owner, wakeup, now, now + ttl_seconds)
            self._turns[session_id] = lease
            return lease

        return self._write(op)

    def renew_turn(self, session_id: str, stream_id: str, ttl_seconds: float) -> bool:
        now = self._clock()

        def op() -> bool:
            held = self._turns.get(session_id)
            if held is None or held.stream_id != stream_id:
                return False
            self._turns[session_id] = replace(held, expires_at=now + ttl_seconds)
            return True

        return self._write(op)

    def end_turn(self, session_id: str, stream_id: str) -> bool:
        def op() -> bool:
            self._deny_pending(session_id, stream_id)
            held = self._turns.get(session_id)
            if held is None or held.stream_id != stream_id:
                return False
            del self._turns[session_id]
            return True

        return self._write(op)

    def running_turns(self) -> list[TurnLease]:
        now = self._clock()
        return self._read(lambda: [t for t in self._turns.values() if t.expires_at > now])

    def ask_approval(self, approval: ApprovalRecord) -> bool:
        now = self._clock()

        def op() -> bool:
            held = self._turns.get(approval.session_id)
            if not approval.background and (
                held is None or held.stream_id != approval.stream_id or held.expires_at <= now
            ):
                return False
            for old in [a for a in self._approvals.values() if a.status != "pending"]:
                if old.created_at < approval.created_at - _KEEP_DECIDED_SECONDS:
                    del self._approvals[old.id]
            self._approvals[approval.id] = approval
            return True

        return self._write(op)

    def decide_approval(self, approval_id: str, approve: bool) -> tuple[ApprovalRecord, bool]:
        return self._settle(approval_id, "approved" if approve else "denied")

    def expire_approval(self, approval_id: str) -> tuple[ApprovalRecord, bool]:
        return self._settle(approval_id, "expired")

    def _settle(self, approval_id: str, status: ApprovalStatus) -> tuple[ApprovalRecord, bool]:
        def op() -> tuple[ApprovalRecord, bool]:
            approval = self._approvals[approval_id]  # KeyError: unknown
            if approval.status != "pending":
                return approval, False
            decided = replace(approval, status=status)
            self._approvals[approval_id] = decided
            return decided, True

        return self._write(op)

    def pending_unit_approvals(self) -> list[ApprovalRecord]:
        def op() -> list[ApprovalRecord]:
            found = [a for a in self._approvals.values() if a.background and a.status == "pending"]
            return sorted(found, key=lambda a: a.created_at)

        return self._read(op)

    def get_approval(self, approval_id: str) -> ApprovalRecord | None:
        return self._read(lambda: self._approvals.get(approval_id))

    def pending_approval(self, session_id: str) -> ApprovalRecord | None:
        now = self._clock()

        def op() -> ApprovalRecord | None:
            held = self._turns.get(session_id)
            if held is None or held.expires_at <= now:
                return None
            return next(
                (
                    a
                    for a in self._approvals.values()
                    if a.session_id == session_id
                    and a.stream_id == held.stream_id
                    and a.status == "pending"
                ),
                None,
            )

        return self._read(op)

    def approval_counts(self) -> dict[str, int]:
        def op() -> dict[str, int]:
            counts: dict[str, int] = {}
            for a in self._approvals.values():
                counts[a.status] = counts.get(a.status, 0) + 1
            return counts

        return self._read(op)

    # -- retention

    def prune_idempotency(self, before: float, limit: int, *, dry_run: bool = False) -> int:
        def op() -> int:
            old = sorted(
                (r for r in self._idem.values() if r.state == "done" and r.updated_at < before),
                key=lambda r: r.updated_at,
            )[: max(int(limit), 0)]
            if not dry_run:
                for r in old:
                    del self._idem[r.key]
            return len(old)

        return self._read(op) if dry_run else self._write(op)

    def prune_tombstones(self, before: float, limit: int, *, dry_run: bool = False) -> int:
        def op() -> int:
            old = sorted(
                (sid for sid, at in self._tombstones.items() if at < before),
                key=lambda sid: self._tombstones[sid],
            )[: max(int(limit), 0)]
            if not dry_run:
                for sid in old:
                    del self._tombstones[sid]
            return len(old)

        return self._read(op) if dry_run else self._write(op)

    def prune_archived_messages(self, before: float, limit: int, *, dry_run: bool = False) -> int:
        def op() -> int:
            old = sorted(
                (
                    (m.archived_at, m.id, s)
                    for s in self._sessions.values()
                    for m in s.messages
                    if m.archived_at is not None
                    and m.archived_at < before
                    and (m.display_kind is None or m.folded_at is not None)
                ),
                key=lambda found: (found[0], found[1]),
            )[: max(int(limit), 0)]
            if not dry_run:
                gone: dict[str, set[int]] = {}
                for _, mid, s in old:
                    gone.setdefault(s.id, set()).add(mid)
                for sid, ids in gone.items():
                    s = self._sessions[sid]
                    s.messages = [m for m in s.messages if m.id not in ids]
                    # As a deleted SQL row frees its (session_id, dedupe_key).
                    s.by_dedupe = {k: m for k, m in s.by_dedupe.items() if m.id not in ids}
            return len(old)

        return self._read(op) if dry_run else self._write(op)

    def unfolded_deliveries(self, wanted: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        def op() -> set[tuple[str, str]]:
            found = set()
            for sid, key in wanted:
                s = self._sessions.get(sid)
                m = s.by_dedupe.get(key) if s is not None else None
                if m is not None and m.display_kind is not None and m.folded_at is None:
                    found.add((sid, key))
            return found

        return self._read(op)


# mypy proves the backend keeps the protocol, without importing it at run time.
if TYPE_CHECKING:
    _conforms: type[SessionBackend] = MemorySessions
