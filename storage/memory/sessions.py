"""An in-memory ``SessionBackend``: the SQL backends' semantics, nothing on disk.

For tests and for embedding where no transcript must outlive the process. The rules are
``delivery.session_rules``'s; this module is ``MemoryRows``, the rows of the port kept in
dictionaries, and a transaction that is one lock. Every rule checks before it writes, so
an operation that raises has changed nothing (what a SQL transaction gives). JSON values are
kept as their stored text and decoded on every read, so callers never share the store's
objects and get back exactly what SQL would return. Coroutine variants run inline: each
operation is a few dictionary steps under an uncontended lock, cheaper than a thread hop.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from delivery.session_backend import (
    ApprovalRecord,
    ApprovalStatus,
    IdempotencyRecord,
    MessageHit,
    MessageRecord,
    NewMessage,
    NewSession,
    SessionRecord,
    SessionState,
    SessionStoreError,
    TurnLease,
    decode_json,
    encode_json,
    mark_snippet,
)
from delivery.session_rows import SessionRows
from delivery.session_rules import SessionRules

T = TypeVar("T")
_stores = itertools.count(1)


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
    metadata_json: str | None = None
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
            metadata=decode_json(self.metadata_json),
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


def _recency(s: _Session) -> tuple[float, str]:
    return (-s.updated_at, s.id)


class _State:
    """Everything one memory store holds."""

    def __init__(self) -> None:
        self.sessions: dict[str, _Session] = {}
        self.tombstones: dict[str, float] = {}
        self.idem: dict[str, _Idem] = {}
        self.turns: dict[str, TurnLease] = {}
        self.approvals: dict[str, ApprovalRecord] = {}
        self.next_id = itertools.count(1)  # store-wide, never reused (like AUTOINCREMENT)


class MemoryRows:
    """``SessionRows`` over a ``_State`` (the caller holds its lock)."""

    def __init__(self, state: _State) -> None:
        self._s = state

    def _rows(self, session_id: str) -> list[_Message]:
        s = self._s.sessions.get(session_id)
        return s.messages if s is not None else []

    # -- sessions and tombstones

    def live(self, session_id: str) -> bool:
        return session_id in self._s.sessions

    def session(self, session_id: str) -> SessionRecord | None:
        s = self._s.sessions.get(session_id)
        return s.record() if s is not None else None

    def tombstoned(self, session_id: str) -> bool:
        return session_id in self._s.tombstones

    def state(self, session_id: str) -> SessionState:
        if session_id in self._s.sessions:
            return "live"
        return "deleted" if session_id in self._s.tombstones else "unknown"

    def insert_session(self, session_id: str, new: NewSession, now: float) -> None:
        if session_id not in self._s.sessions:
            self._s.sessions[session_id] = _Session(
                session_id, new.source_json, new.session_key, new.title, now, now
            )

    def insert_new_session(self, session_id: str, new: NewSession, now: float) -> bool:
        if session_id in self._s.sessions or session_id in self._s.tombstones:
            return False
        self.insert_session(session_id, new, now)
        return True

    def delete_session(self, session_id: str) -> bool:
        return self._s.sessions.pop(session_id, None) is not None

    def tombstone(self, session_id: str, now: float) -> None:
        self._s.tombstones[session_id] = now

    def untombstone(self, session_id: str) -> None:
        self._s.tombstones.pop(session_id, None)

    def touch(self, session_id: str, now: float) -> None:
        s = self._s.sessions.get(session_id)
        if s is not None:
            s.updated_at = now

    def sessions(self, limit: int, offset: int) -> list[SessionRecord]:
        ordered = sorted(self._s.sessions.values(), key=_recency)
        return [s.record() for s in ordered[offset : offset + limit]]

    def session_by_key(self, session_key: str) -> SessionRecord | None:
        hits = [s for s in self._s.sessions.values() if s.session_key == session_key]
        return min(hits, key=_recency).record() if hits else None

    def prefix_ids(self, prefix: str, limit: int) -> tuple[list[str], bool]:
        hits = sorted(
            (
                s
                for sid, s in self._s.sessions.items()
                if sid == prefix or sid.startswith(prefix + "_")
            ),
            key=lambda s: (s.created_at, s.id),
        )
        return [s.id for s in hits[:limit]], prefix in self._s.tombstones

    def set_title(self, session_id: str, title: str, *, if_untitled: bool) -> bool:
        s = self._s.sessions.get(session_id)
        if s is None or (if_untitled and s.title is not None):
            return False
        s.title = title
        return True

    def set_system_prompt(self, session_id: str, prompt: str | None) -> bool:
        s = self._s.sessions.get(session_id)
        if s is not None:
            s.system_prompt = prompt
        return s is not None

    def set_metadata(self, session_id: str, metadata_json: str | None) -> bool:
        s = self._s.sessions.get(session_id)
        if s is not None:
            s.metadata_json = metadata_json
        return s is not None

    # -- messages

    def insert_message(self, session_id: str, message: NewMessage, now: float) -> MessageRecord:
        s = self._s.sessions[session_id]
        if message.dedupe_key is not None and message.dedupe_key in s.by_dedupe:
            return s.by_dedupe[message.dedupe_key].record()
        row = _Message(
            id=next(self._s.next_id),
            role=message.role,
            content=message.content,
            created_at=now,
            display_kind=message.display_kind,
            metadata_json=message.metadata_json,
            dedupe_key=message.dedupe_key,
        )
        s.messages.append(row)
        if message.dedupe_key is not None:
            s.by_dedupe[message.dedupe_key] = row
        return row.record()

    def insert_messages(self, session_id: str, messages: Sequence[NewMessage], now: float) -> None:
        for m in messages:
            self.insert_message(session_id, m, now)

    def messages_after(
        self, session_id: str, after_id: int, limit: int | None
    ) -> list[MessageRecord]:
        rows = [m for m in self._rows(session_id) if m.id > after_id]
        return [m.record() for m in (rows if limit is None else rows[:limit])]

    def messages_before(self, session_id: str, before_id: int, limit: int) -> list[MessageRecord]:
        rows = [m for m in self._rows(session_id) if m.id < before_id]
        return [m.record() for m in rows[len(rows) - limit :]] if limit else []

    def transcript(self, session_id: str, *, live: bool) -> list[MessageRecord]:
        return [m.record() for m in self._rows(session_id) if not live or m.archived_at is None]

    def messages_by_id(self, session_id: str, ids: Sequence[int]) -> list[MessageRecord]:
        wanted = set(ids)
        return [m.record() for m in self._rows(session_id) if m.id in wanted]

    def fold(self, session_id: str, upto: int, now: float) -> list[MessageRecord]:
        taken = [
            m
            for m in self._rows(session_id)
            if m.display_kind is not None and m.folded_at is None and m.id <= upto
        ]
        for m in taken:
            m.folded_at = now
        return [m.record() for m in taken]

    def mark_seen(self, session_id: str, ids: Sequence[int], now: float) -> None:
        wanted = set(ids)
        for m in self._rows(session_id):
            if m.id in wanted and m.seen_at is None and m.folded_at is not None:
                m.seen_at = now

    def archive(self, session_id: str, ids: Sequence[int], summary_id: int, now: float) -> None:
        wanted = set(ids)
        for m in self._rows(session_id):
            if m.id in wanted:
                m.archived_at, m.summary_id = now, summary_id

    def supersede(self, session_id: str, ids: Sequence[int], how: str) -> int:
        wanted = set(ids)
        rows = [m for m in self._rows(session_id) if m.id in wanted and m.display_kind is None]
        for m in rows:
            meta = decode_json(m.metadata_json) or {}
            m.metadata_json = encode_json({**meta, "superseded": how})
        return len(rows)

    def search(self, terms: Sequence[str], limit: int) -> list[MessageHit]:
        rows = sorted(
            ((s.id, m) for s in self._s.sessions.values() for m in s.messages),
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

    def unfolded_by_dedupe(self, wanted: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        found = set()
        for sid, key in wanted:
            s = self._s.sessions.get(sid)
            m = s.by_dedupe.get(key) if s is not None else None
            if m is not None and m.display_kind is not None and m.folded_at is None:
                found.add((sid, key))
        return found

    def old_archived(self, before: float, limit: int) -> list[int]:
        old = sorted(
            (m.archived_at, m.id)
            for s in self._s.sessions.values()
            for m in s.messages
            if m.archived_at is not None
            and m.archived_at < before
            and (m.display_kind is None or m.folded_at is not None)
        )
        return [mid for _, mid in old[: max(limit, 0)]]

    def delete_messages(self, ids: Sequence[int]) -> int:
        gone, count = set(ids), 0
        for s in self._s.sessions.values():
            kept = [m for m in s.messages if m.id not in gone]
            if len(kept) != len(s.messages):
                count += len(s.messages) - len(kept)
                s.messages = kept
                # As a deleted SQL row frees its (session_id, dedupe_key).
                s.by_dedupe = {k: m for k, m in s.by_dedupe.items() if m.id not in gone}
        return count

    # -- idempotency records

    def idempotency(self, key: str) -> IdempotencyRecord | None:
        row = self._s.idem.get(key)
        return row.record() if row is not None else None

    def claim_idempotency(self, key: str, owner: str, session_id: str | None, now: float) -> None:
        row = self._s.idem.get(key)
        if row is None:
            self._s.idem[key] = _Idem(key, "running", owner, session_id, None, now, now)
        else:
            row.state, row.owner, row.session_id, row.updated_at = "running", owner, session_id, now

    def finish_idempotency(
        self, key: str, session_id: str, response_json: str | None, now: float
    ) -> None:
        row = self._s.idem.get(key)
        if row is None:
            self._s.idem[key] = _Idem(key, "done", None, session_id, response_json, now, now)
        else:
            row.state, row.owner, row.session_id = "done", None, session_id
            row.response_json, row.updated_at = response_json, now

    def delete_idempotency(self, key: str) -> None:
        self._s.idem.pop(key, None)

    def old_idempotency(self, before: float, limit: int) -> list[str]:
        old = sorted(
            (r.updated_at, r.key)
            for r in self._s.idem.values()
            if r.state == "done" and r.updated_at < before
        )
        return [key for _, key in old[: max(limit, 0)]]

    def forget_idempotency(self, keys: Sequence[str]) -> int:
        done = [k for k in keys if k in self._s.idem and self._s.idem[k].state == "done"]
        for k in done:
            del self._s.idem[k]
        return len(done)

    def old_tombstones(self, before: float, limit: int) -> list[str]:
        old = sorted((at, sid) for sid, at in self._s.tombstones.items() if at < before)
        return [sid for _, sid in old[: max(limit, 0)]]

    def forget_tombstones(self, ids: Sequence[str]) -> int:
        return sum(self._s.tombstones.pop(sid, None) is not None for sid in ids)

    # -- turn leases

    def lease(self, session_id: str) -> TurnLease | None:
        return self._s.turns.get(session_id)

    def put_lease(self, lease: TurnLease) -> None:
        self._s.turns[lease.session_id] = lease

    def extend_lease(self, session_id: str, stream_id: str, expires_at: float) -> bool:
        held = self._s.turns.get(session_id)
        if held is None or held.stream_id != stream_id:
            return False
        self._s.turns[session_id] = replace(held, expires_at=expires_at)
        return True

    def drop_lease(self, session_id: str, stream_id: str) -> bool:
        held = self._s.turns.get(session_id)
        if held is None or held.stream_id != stream_id:
            return False
        del self._s.turns[session_id]
        return True

    def leases(self, alive_at: float) -> list[TurnLease]:
        return [t for t in self._s.turns.values() if t.expires_at > alive_at]

    # -- approvals

    def approval(self, approval_id: str) -> ApprovalRecord | None:
        return self._s.approvals.get(approval_id)

    def insert_approval(self, approval: ApprovalRecord) -> None:
        self._s.approvals[approval.id] = approval

    def settle_approval(self, approval_id: str, status: ApprovalStatus, answer: str = "") -> bool:
        found = self._s.approvals.get(approval_id)
        if found is None or found.status != "pending":
            return False
        self._s.approvals[approval_id] = replace(found, status=status, answer=answer)
        return True

    def deny_pending(self, session_id: str, stream_id: str) -> None:
        for a in list(self._s.approvals.values()):
            if a.session_id == session_id and a.stream_id == stream_id and a.status == "pending":
                self._s.approvals[a.id] = replace(a, status="denied")

    def forget_decided(self, before: float) -> None:
        for a in list(self._s.approvals.values()):
            if a.status != "pending" and a.created_at < before:
                del self._s.approvals[a.id]

    def pending_of(self, session_id: str, stream_id: str) -> ApprovalRecord | None:
        return next(
            (
                a
                for a in self._s.approvals.values()
                if a.session_id == session_id and a.stream_id == stream_id and a.status == "pending"
            ),
            None,
        )

    def pending_units(self) -> list[ApprovalRecord]:
        found = [a for a in self._s.approvals.values() if a.background and a.status == "pending"]
        return sorted(found, key=lambda a: a.created_at)

    def approval_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for a in self._s.approvals.values():
            counts[a.status] = counts.get(a.status, 0) + 1
        return counts


class _MemoryTx:
    """``SessionTx`` of one memory store: a transaction is its lock held."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._rows = MemoryRows(_State())
        self._closed = False
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

    def write(self, locks: tuple[str, ...], op: Callable[[SessionRows], T]) -> T:
        with self._lock:
            self._check_open()
            out = op(self._rows)  # a rule raises before it changes anything
            self._writes += 1
            return out

    async def awrite(self, locks: tuple[str, ...], op: Callable[[SessionRows], T]) -> T:
        return self.write(locks, op)

    def read(self, op: Callable[[SessionRows], T]) -> T:
        with self._lock:
            self._check_open()
            return op(self._rows)

    async def aread(self, op: Callable[[SessionRows], T]) -> T:
        return self.read(op)


class MemorySessions(SessionRules):
    """``SessionBackend`` in this process's memory (see the module docstring)."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        super().__init__(_MemoryTx(), clock)
