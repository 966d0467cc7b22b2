"""The PostgreSQL session backend: sessions, transcripts, tombstones and idempotency records
shared by every server on one database.

The same rules as the SQLite backend (``delivery.session_backend``), kept across processes
and hosts by PostgreSQL itself: each write runs in one transaction that first takes a
transaction-scoped advisory lock on its session id (or idempotency key), so a delete, a
creation, a fold and an append of one session never interleave, whichever server runs
them. Folding is one ``UPDATE ... WHERE folded_at IS NULL RETURNING``: a delivery row goes
to exactly one turn. Message ids come from a sequence, never reused. Coroutine variants run
the same code on a worker thread: the event loop never waits on the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
import psycopg_pool

from delivery.session_backend import (
    ApprovalRecord,
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
)
from storage import compaction as compacting
from storage import running_turns as turns
from storage.postgres import sql as q
from storage.postgres.conn import PostgresUnavailable, check_url, explain, open_pool, redact

T = TypeVar("T")
# Retention's archived transcript rows: (pick, prune), shared with the other dialect.
_ARCHIVED = compacting.archived_statements("%s")
Conn = psycopg.Connection[Any]


class PostgresSessionsUnavailable(SessionStoreError):
    """The session store's database cannot be used now."""


def _session(row: tuple[Any, ...]) -> SessionRecord:
    sid, source, key, title, created, updated, prompt = row
    return SessionRecord(sid, decode_json(source), key, title, created, updated, prompt)


def _message(row: tuple[Any, ...]) -> MessageRecord:
    mid, role, content, created, kind, meta, folded_at, seen_at, archived_at, summary_id = row
    return MessageRecord(
        mid,
        role,
        content,
        created,
        kind,
        decode_json(meta),
        folded_at is not None,
        seen=seen_at is not None,
        archived=archived_at is not None,
        summary_id=summary_id,
    )


def _idem(row: tuple[Any, ...]) -> IdempotencyRecord:
    key, state, owner, sid, response, created, updated = row
    return IdempotencyRecord(key, state, owner, sid, decode_json(response), created, updated)


def _values(session_id: str, m: NewMessage, now: float) -> tuple[Any, ...]:
    return (session_id, m.role, m.content, now, m.display_kind, m.metadata_json, m.dedupe_key)


def _one(conn: Conn, query: str, params: tuple[Any, ...]) -> tuple[Any, ...] | None:
    return conn.execute(query, params).fetchone()


def _state(conn: Conn, session_id: str) -> SessionState:
    if _one(conn, q.SQL_SESSION_EXISTS, (session_id,)) is not None:
        return "live"
    if _one(conn, q.SQL_TOMBSTONED, (session_id,)) is not None:
        return "deleted"
    return "unknown"


def _require_live(conn: Conn, session_id: str) -> None:
    if _one(conn, q.SQL_SESSION_EXISTS, (session_id,)) is None:
        raise SessionGone(session_id)


def _insert_session(conn: Conn, sid: str, new: NewSession, now: float, *, revive: bool) -> None:
    if revive:
        conn.execute(q.SQL_UNTOMBSTONE, (sid,))
    elif _one(conn, q.SQL_TOMBSTONED, (sid,)) is not None:
        raise SessionGone(sid)
    inserted = conn.execute(
        q.SQL_INSERT_SESSION, (sid, new.source_json, new.session_key, new.title, now, now)
    ).rowcount
    if new.exclusive and not inserted:
        raise SessionTaken(sid)


def _insert_message(conn: Conn, sid: str, m: NewMessage, now: float) -> MessageRecord:
    row = _one(conn, q.SQL_INSERT_MESSAGE, _values(sid, m, now))
    if row is None:  # the dedupe key names an existing row: that one is the answer
        row = _one(conn, q.SQL_MESSAGE_BY_DEDUPE, (sid, m.dedupe_key))
    assert row is not None
    return _message(row)


def _transcript(conn: Conn, sid: str, *, live: bool = False) -> tuple[MessageRecord, ...]:
    sql = q.SQL_LIVE_TRANSCRIPT if live else q.SQL_TRANSCRIPT
    return tuple(_message(r) for r in conn.execute(sql, (sid,)).fetchall())


def _fold(conn: Conn, sid: str, now: float, upto: int | None) -> list[MessageRecord]:
    if upto is None:
        rows = conn.execute(q.SQL_FOLD_ALL, (now, sid)).fetchall()
    else:
        rows = conn.execute(q.SQL_FOLD, (now, sid, upto)).fetchall()
    return sorted((_message(r) for r in rows), key=lambda m: m.id)


class PostgresSessions:
    """``SessionBackend`` on a PostgreSQL database (see the module docstring)."""

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 8,
        clock: Callable[[], float] = time.time,
    ) -> None:
        check_url(url)
        self._url = url
        self._clock = clock
        self._writes = 0
        try:
            self._pool: psycopg_pool.ConnectionPool[Any] | None = open_pool(
                url, name="reveille-sessions", max_size=pool_size
            )
        except PostgresUnavailable as exc:
            raise PostgresSessionsUnavailable(str(exc)) from None

    @property
    def url(self) -> str:
        return redact(self._url)

    def stats(self) -> dict[str, int]:
        self._require_pool()
        return {"writes": self._writes, "commits": self._writes, "durable_commits": self._writes}

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    # -- plumbing

    def _require_pool(self) -> psycopg_pool.ConnectionPool[Any]:
        if self._pool is None:
            raise SessionStoreError(f"session store {self.url} is closed")
        return self._pool

    @contextlib.contextmanager
    def _conn(self, *, write: bool) -> Iterator[Conn]:
        pool = self._require_pool()
        try:
            with pool.connection() as conn:
                if write:
                    with conn.transaction():
                        yield conn
                    self._writes += 1
                else:
                    with conn.transaction():  # one snapshot for the whole read
                        yield conn
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            err = explain(exc, self._url)
            raise PostgresSessionsUnavailable(str(err)) from exc
        except PostgresUnavailable as exc:
            raise PostgresSessionsUnavailable(str(exc)) from exc

    def _write(self, lock: str | None, op: Callable[[Conn], T]) -> T:
        with self._conn(write=True) as conn:
            if lock is not None:
                conn.execute(q.SQL_LOCK_KEY, (lock,))
            return op(conn)

    def _read(self, op: Callable[[Conn], T]) -> T:
        try:
            with self._conn(write=False) as conn:
                return op(conn)
        except PostgresSessionsUnavailable as exc:
            # A pooled connection the server dropped (restart, failover) is discarded by
            # the pool; a read is safe to run once more on a fresh one.
            if not isinstance(exc.__cause__, psycopg.OperationalError):
                raise
        with self._conn(write=False) as conn:
            return op(conn)

    # -- sessions

    def create_session(self, session_id: str, new: NewSession) -> SessionRecord:
        now = self._clock()

        def op(conn: Conn) -> SessionRecord:
            if _one(conn, q.SQL_SESSION_EXISTS, (session_id,)) is None:
                _insert_session(conn, session_id, new, now, revive=True)
            elif new.exclusive:
                raise SessionTaken(session_id)
            row = _one(conn, q.SQL_SESSION, (session_id,))
            assert row is not None
            return _session(row)

        return self._write(session_id, op)

    async def acreate_session(self, session_id: str, new: NewSession) -> SessionRecord:
        return await asyncio.to_thread(self.create_session, session_id, new)

    def get_session(self, session_id: str) -> SessionRecord | None:
        row = self._read(lambda c: _one(c, q.SQL_SESSION, (session_id,)))
        return _session(row) if row is not None else None

    def list_sessions(self, limit: int, offset: int) -> list[SessionRecord]:
        rows = self._read(lambda c: c.execute(q.SQL_LIST_SESSIONS, (limit, offset)).fetchall())
        return [_session(r) for r in rows]

    def find_session_by_key(self, session_key: str) -> SessionRecord | None:
        row = self._read(lambda c: _one(c, q.SQL_SESSION_BY_KEY, (session_key,)))
        return _session(row) if row is not None else None

    def _sessions_by_prefix(self, prefix: str, limit: int) -> PrefixSessions:
        def op(conn: Conn) -> PrefixSessions:
            ids = [
                r[0]
                for r in conn.execute(
                    q.SQL_SESSIONS_BY_PREFIX, (prefix, prefix + "_", prefix + "`", limit)
                ).fetchall()
            ]
            transcripts = tuple((sid, _transcript(conn, sid)) for sid in ids)
            deleted = prefix not in ids and _one(conn, q.SQL_TOMBSTONED, (prefix,)) is not None
            return PrefixSessions(transcripts, deleted)

        return self._read(op)

    async def asessions_by_prefix(self, prefix: str, limit: int) -> PrefixSessions:
        return await asyncio.to_thread(self._sessions_by_prefix, prefix, limit)

    async def aset_title(self, session_id: str, title: str, *, if_untitled: bool) -> bool:
        sql = q.SQL_SET_TITLE_IF_UNTITLED if if_untitled else q.SQL_SET_TITLE

        def op(conn: Conn) -> bool:
            return conn.execute(sql, (title, session_id)).rowcount > 0

        return await asyncio.to_thread(self._write, session_id, op)

    async def aset_system_prompt(self, session_id: str, prompt: str | None) -> bool:
        def op(conn: Conn) -> bool:
            return bool(conn.execute(q.SQL_SET_SYSTEM_PROMPT, (prompt, session_id)).rowcount > 0)

        return await asyncio.to_thread(self._write, session_id, op)

    def delete_session(self, session_id: str) -> bool:
        now = self._clock()

        def op(conn: Conn) -> bool:
            conn.execute(q.SQL_TOMBSTONE, (session_id, now))
            return conn.execute(q.SQL_DELETE_SESSION, (session_id,)).rowcount > 0

        return self._write(session_id, op)

    # -- messages

    def append_message(self, session_id: str, message: NewMessage) -> MessageRecord:
        now = self._clock()

        def op(conn: Conn) -> MessageRecord:
            _require_live(conn, session_id)
            out = _insert_message(conn, session_id, message, now)
            conn.execute(q.SQL_TOUCH_SESSION, (now, session_id))
            return out

        return self._write(session_id, op)

    def messages(self, session_id: str, after_id: int, limit: int | None) -> list[MessageRecord]:
        def op(conn: Conn) -> list[MessageRecord]:
            _require_live(conn, session_id)
            return [
                _message(r)
                for r in conn.execute(q.SQL_MESSAGES_AFTER, (session_id, after_id, limit))
            ]

        return self._read(op)

    def messages_before(self, session_id: str, before_id: int, limit: int) -> list[MessageRecord]:
        def op(conn: Conn) -> list[MessageRecord]:
            _require_live(conn, session_id)
            rows = conn.execute(q.SQL_MESSAGES_BEFORE, (session_id, before_id, limit)).fetchall()
            return [_message(r) for r in reversed(rows)]

        return self._read(op)

    def supersede(self, session_id: str, ids: Sequence[int], how: str) -> int:
        def op(conn: Conn) -> int:
            _require_live(conn, session_id)
            return int(conn.execute(q.SQL_SUPERSEDE, (how, session_id, list(ids))).rowcount)

        return self._write(session_id, op)

    # -- search

    def search_messages(self, terms: Sequence[str], limit: int) -> list[MessageHit]:
        params = {"q": q.tsquery(list(terms)), "limit": limit}
        rows = self._read(lambda c: c.execute(q.SQL_SEARCH, params).fetchall())
        return [MessageHit(r[0], int(r[1]), r[2], float(r[3]), r[4]) for r in rows]

    # -- turns

    def _begin_turn(self, session_id: str, create: NewSession | None) -> TurnStart:
        def peek(conn: Conn) -> TurnStart | None:
            state = _state(conn, session_id)
            if state != "live":
                return TurnStart(state)
            history = _transcript(conn, session_id, live=True)
            if any(m.is_delivery and not m.folded for m in history):
                return None
            return TurnStart("live", history)

        found = self._read(peek)
        if found is not None and (found.state == "live" or create is None):
            return found
        now = self._clock()

        def op(conn: Conn) -> TurnStart:
            state = _state(conn, session_id)
            if state != "live":
                if create is None:
                    return TurnStart(state)
                _insert_session(conn, session_id, create, now, revive=True)
            history = _transcript(conn, session_id, live=True)
            upto = history[-1].id if history else 0
            taken = [m.as_folded() for m in _fold(conn, session_id, now, upto)]
            return TurnStart(state, history, tuple(taken))

        return self._write(session_id, op)

    async def abegin_turn(self, session_id: str, create: NewSession | None) -> TurnStart:
        return await asyncio.to_thread(self._begin_turn, session_id, create)

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

        def op(conn: Conn) -> list[MessageRecord]:
            if create is not None:
                _insert_session(conn, session_id, create, now, revive=False)
            _require_live(conn, session_id)
            out = [_insert_message(conn, session_id, m, now) for m in messages]
            conn.execute(q.SQL_TOUCH_SESSION, (now, session_id))
            if idempotency_key is not None:
                conn.execute(
                    q.SQL_IDEM_DONE, (idempotency_key, session_id, response_json, now, now)
                )
            compacting.mark_seen(conn, "%s", session_id, seen, now)
            return out

        return self._write(session_id, op)

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
        await asyncio.to_thread(
            lambda: self.append_turn(
                session_id,
                messages,
                create=create,
                idempotency_key=idempotency_key,
                response_json=response_json,
                seen=seen,
            )
        )

    def _compact(self, session_id: str, compaction: Compaction) -> MessageRecord | None:
        now = self._clock()

        def op(conn: Conn) -> MessageRecord | None:
            # The lease's lock too: no take-over of the session between the lease check and
            # the commit (the session lock, taken first, is never taken after this one).
            conn.execute(q.SQL_LOCK_KEY, ("turn:" + session_id,))

            def insert() -> MessageRecord:
                return _insert_message(conn, session_id, compaction.summary, now)

            return compacting.compact(conn, "%s", session_id, compaction, now, insert)

        # The session's lock: a fold, an append or a delete of it never interleaves.
        return self._write(session_id, op)

    async def acompact(self, session_id: str, compaction: Compaction) -> MessageRecord | None:
        return await asyncio.to_thread(self._compact, session_id, compaction)

    # -- idempotency

    def claim_idempotent(
        self,
        key: str,
        owner: str,
        session_id: str | None,
        takeover: Callable[[str], bool] | None,
    ) -> tuple[IdempotencyRecord, bool]:
        now = self._clock()

        def op(conn: Conn) -> tuple[IdempotencyRecord, bool]:
            row = _one(conn, q.SQL_IDEM, (key,))
            if row is not None:
                rec = _idem(row)
                if not (
                    rec.state == "running"
                    and rec.owner != owner
                    and takeover is not None
                    and takeover(rec.owner or "")
                ):
                    return rec, rec.owner == owner
            conn.execute(q.SQL_IDEM_CLAIM, (key, owner, session_id, now, now))
            again = _one(conn, q.SQL_IDEM, (key,))
            assert again is not None
            return _idem(again), True

        return self._write("idem:" + key, op)

    def release_idempotent(self, key: str, owner: str) -> bool:
        return self._write(
            "idem:" + key, lambda c: c.execute(q.SQL_IDEM_RELEASE, (key, owner)).rowcount > 0
        )

    # -- running turns and their approvals (each write holds its session's advisory lock)

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
        return self._write("turn:" + session_id, lambda c: turns.take_turn(c, "%s", lease, is_dead))

    def renew_turn(self, session_id: str, stream_id: str, ttl_seconds: float) -> bool:
        until = self._clock() + ttl_seconds
        return self._write(
            "turn:" + session_id,
            lambda c: turns.renew_turn(c, "%s", session_id, stream_id, until),
        )

    def end_turn(self, session_id: str, stream_id: str) -> bool:
        return self._write(
            "turn:" + session_id, lambda c: turns.end_turn(c, "%s", session_id, stream_id)
        )

    def running_turns(self) -> list[TurnLease]:
        now = self._clock()
        return self._read(lambda c: turns.running_turns(c, "%s", now))

    def ask_approval(self, approval: ApprovalRecord) -> bool:
        # A background unit's holds no session: no need to wait on the session's lock.
        lock = None if approval.background else "turn:" + approval.session_id
        return self._write(lock, lambda c: turns.ask_approval(c, "%s", approval))

    def decide_approval(self, approval_id: str, approve: bool) -> tuple[ApprovalRecord, bool]:
        return self._write(
            "approval:" + approval_id,
            lambda c: turns.decide_approval(c, "%s", approval_id, approve),
        )

    def expire_approval(self, approval_id: str) -> tuple[ApprovalRecord, bool]:
        return self._write(
            "approval:" + approval_id, lambda c: turns.expire_approval(c, "%s", approval_id)
        )

    def pending_unit_approvals(self) -> list[ApprovalRecord]:
        return self._read(lambda c: turns.pending_unit_approvals(c, "%s"))

    def get_approval(self, approval_id: str) -> ApprovalRecord | None:
        return self._read(lambda c: turns.get_approval(c, "%s", approval_id))

    def pending_approval(self, session_id: str) -> ApprovalRecord | None:
        now = self._clock()
        return self._read(lambda c: turns.pending_approval(c, "%s", session_id, now))

    def approval_counts(self) -> dict[str, int]:
        return self._read(turns.approval_counts)

    # -- retention

    def _prune(self, pick: str, prune: str, before: float, limit: int, dry_run: bool) -> int:
        params = (before, int(limit))
        if dry_run:
            return self._read(lambda c: len(c.execute(pick, params).fetchall()))
        return self._write(None, lambda c: int(c.execute(prune, params).rowcount))

    def prune_idempotency(self, before: float, limit: int, *, dry_run: bool = False) -> int:
        return self._prune(q.SQL_PICK_IDEM_DONE, q.SQL_PRUNE_IDEM, before, limit, dry_run)

    def prune_tombstones(self, before: float, limit: int, *, dry_run: bool = False) -> int:
        return self._prune(q.SQL_PICK_TOMBSTONES, q.SQL_PRUNE_TOMBSTONES, before, limit, dry_run)

    def prune_archived_messages(self, before: float, limit: int, *, dry_run: bool = False) -> int:
        return self._prune(*_ARCHIVED, before, limit, dry_run)

    def unfolded_deliveries(self, wanted: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        if not wanted:
            return set()
        sids, keys = [w[0] for w in wanted], [w[1] for w in wanted]
        rows = self._read(lambda c: c.execute(q.SQL_UNFOLDED_BY_DEDUPE, (sids, keys)).fetchall())
        return {(str(r[0]), str(r[1])) for r in rows}


# mypy proves the backend keeps the protocol, without importing it at run time.
if TYPE_CHECKING:
    _conforms: type[SessionBackend] = PostgresSessions
