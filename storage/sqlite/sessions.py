"""The SQLite session backend: sessions, transcripts, tombstones and idempotency in one file.

Writes go to one ``GroupCommitWriter`` thread that runs every waiting write in one
``BEGIN IMMEDIATE`` transaction and commits once, so concurrent turns share fsyncs and
several stores (or processes) on one file stay atomic. Reads share one connection under a
lock; WAL lets them run beside the writer. The file is born 0600 and a foreign or newer
file is refused unmodified (``storage.sqlite.files``).
"""

from __future__ import annotations

import contextlib
import functools
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

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
from storage.sqlite import files as sqlite_files
from storage.sqlite.fts import fts_query
from storage.sqlite.reader import GroupReader
from storage.sqlite.sessions_sql import (
    DDL,
    MESSAGES_INDEX,
    REQUIRED_COLUMNS,
    RETENTION_DDL,
    SCHEMA_VERSION,
    SQL_DELETE_SESSION,
    SQL_FOLD,
    SQL_IDEM,
    SQL_IDEM_CLAIM,
    SQL_IDEM_DONE,
    SQL_IDEM_RELEASE,
    SQL_INSERT_MESSAGE,
    SQL_INSERT_SESSION,
    SQL_LIST_SESSIONS,
    SQL_LIVE_TRANSCRIPT,
    SQL_MESSAGE_BY_DEDUPE,
    SQL_MESSAGES_AFTER,
    SQL_MESSAGES_BEFORE,
    SQL_PICK_IDEM_DONE,
    SQL_PICK_TOMBSTONES,
    SQL_PRUNE_IDEM,
    SQL_PRUNE_TOMBSTONES,
    SQL_SEARCH,
    SQL_SESSION,
    SQL_SESSION_BY_KEY,
    SQL_SESSION_EXISTS,
    SQL_SESSIONS_BY_PREFIX,
    SQL_SET_SYSTEM_PROMPT,
    SQL_SET_TITLE,
    SQL_SET_TITLE_IF_UNTITLED,
    SQL_SUPERSEDE,
    SQL_TOMBSTONE,
    SQL_TOMBSTONED,
    SQL_TOUCH_SESSION,
    SQL_TRANSCRIPT,
    SQL_UNFOLDED,
    SQL_UNFOLDED_BY_DEDUPE,
    SQL_UNTOMBSTONE,
    UPGRADE_COLUMNS,
    sql_insert_messages,
)
from storage.sqlite.writer import GroupCommitWriter

T = TypeVar("T")
# Retention's archived transcript rows: (pick, prune), shared with the other dialect.
_ARCHIVED = compacting.archived_statements("?")


def _session(row: sqlite3.Row) -> SessionRecord:
    return SessionRecord(
        id=row["id"],
        source=decode_json(row["source"]),
        session_key=row["session_key"],
        title=row["title"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        system_prompt=row["system_prompt"],
    )


def _message(row: sqlite3.Row) -> MessageRecord:
    return MessageRecord(
        id=row["id"],
        role=row["role"],
        content=row["content"],
        created_at=row["created_at"],
        display_kind=row["display_kind"],
        display_metadata=decode_json(row["display_metadata"]),
        folded=row["folded_at"] is not None,
        seen=row["seen_at"] is not None,
        archived=row["archived_at"] is not None,
        summary_id=row["summary_id"],
    )


def _idem(row: sqlite3.Row) -> IdempotencyRecord:
    return IdempotencyRecord(
        key=row["key"],
        state=row["state"],
        owner=row["owner"],
        session_id=row["session_id"],
        response=decode_json(row["response"]),
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


def _values(session_id: str, m: NewMessage, now: float) -> tuple[Any, ...]:
    return (session_id, m.role, m.content, now, m.display_kind, m.metadata_json, m.dedupe_key)


def _state(conn: sqlite3.Connection, session_id: str) -> SessionState:
    if conn.execute(SQL_SESSION_EXISTS, (session_id,)).fetchone() is not None:
        return "live"
    if conn.execute(SQL_TOMBSTONED, (session_id,)).fetchone() is not None:
        return "deleted"
    return "unknown"


def _require_live(conn: sqlite3.Connection, session_id: str) -> None:
    if conn.execute(SQL_SESSION_EXISTS, (session_id,)).fetchone() is None:
        raise SessionGone(session_id)


def _insert_session(
    conn: sqlite3.Connection, session_id: str, new: NewSession, now: float, *, revive: bool
) -> None:
    if revive:
        conn.execute(SQL_UNTOMBSTONE, (session_id,))
    elif conn.execute(SQL_TOMBSTONED, (session_id,)).fetchone() is not None:
        raise SessionGone(session_id)
    inserted = conn.execute(
        SQL_INSERT_SESSION, (session_id, new.source_json, new.session_key, new.title, now, now)
    ).rowcount
    if new.exclusive and not inserted:
        raise SessionTaken(session_id)


def _fold(conn: sqlite3.Connection, session_id: str, now: float) -> list[MessageRecord]:
    rows = [_message(r) for r in conn.execute(SQL_UNFOLDED, (session_id,)).fetchall()]
    if rows:
        conn.executemany(SQL_FOLD, [(now, m.id) for m in rows])
    return [m.as_folded() for m in rows]


def _peek_op(conn: sqlite3.Connection, session_id: str) -> TurnStart | None:
    """A turn's start from a read alone, or None when the writer must fold."""
    state = _state(conn, session_id)
    if state != "live":
        return TurnStart(state)
    history = tuple(_message(r) for r in conn.execute(SQL_LIVE_TRANSCRIPT, (session_id,)))
    if any(m.is_delivery and not m.folded for m in history):
        return None
    return TurnStart("live", history)


def _insert_message(
    conn: sqlite3.Connection, session_id: str, m: NewMessage, now: float
) -> MessageRecord:
    row = conn.execute(SQL_INSERT_MESSAGE, _values(session_id, m, now)).fetchone()
    if row is None:  # the dedupe key names an existing row: that one is the answer
        row = conn.execute(SQL_MESSAGE_BY_DEDUPE, (session_id, m.dedupe_key)).fetchone()
    return _message(row)


def _check_columns(spec: sqlite_files.SqliteFile) -> Callable[[sqlite3.Connection], None]:
    # Older files carry no application id; a table of ours missing our columns is how a
    # foreign file shows itself. Runs before any pragma or DDL could modify the file.
    def check(conn: sqlite3.Connection) -> None:
        for table, required in REQUIRED_COLUMNS.items():
            have = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
            missing = required - have
            if have and missing:
                raise SessionStoreError(
                    f"{spec.path}: table {table!r} exists but lacks columns "
                    f"{sorted(missing)}; this file belongs to something else"
                )

    return check


def _add_columns(conn: sqlite3.Connection, spec: sqlite_files.SqliteFile) -> None:
    """Give an older file the columns added since (``UPGRADE_COLUMNS``), in one transaction
    that reads again what it found: two processes opening one file add each column once."""
    try:
        conn.execute("BEGIN IMMEDIATE")
        for table, column, kind in UPGRADE_COLUMNS:
            have = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
            if have and column not in have:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise sqlite_files.classify(exc, spec) from exc


def _add_search(conn: sqlite3.Connection, spec: sqlite_files.SqliteFile) -> None:
    """Give an older file its full-text index (``MESSAGES_INDEX``) with every message
    already there indexed, once."""
    MESSAGES_INDEX.add_to(conn, spec)


def _not_ours(msg: str) -> SessionStoreError:
    return SessionStoreError(
        f"not a usable SQLite database: {msg}; refusing to modify it — move it aside or "
        "point the store elsewhere"
    )


class SqliteSessions:
    """``SessionBackend`` over one SQLite file (see the module docstring)."""

    def __init__(
        self,
        path: str | Path,
        *,
        busy_timeout_ms: int = 5000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._clock = clock
        # FULL: an acknowledged delivery row must survive power loss, or a completion that
        # was marked delivered could vanish from the transcript.
        self._spec = sqlite_files.SqliteFile(
            path=str(path),
            name="session store",
            application_id=None,
            schema_version=SCHEMA_VERSION,
            errors=sqlite_files.FileErrors(
                not_ours=_not_ours, unavailable=SessionStoreError, too_new=SessionStoreError
            ),
            busy_timeout_ms=busy_timeout_ms,
        )
        self._path = Path(path)
        self._lock = threading.RLock()
        sqlite_files.create_private(self._spec)
        conn = sqlite_files.connect(
            self._spec, check_owner=True, extra_check=_check_columns(self._spec)
        )
        try:
            _add_columns(conn, self._spec)
            sqlite_files.stamp_schema(conn, self._spec, DDL + ";" + RETENTION_DDL)
            _add_search(conn, self._spec)
        except BaseException:
            conn.close()
            raise
        conn.row_factory = sqlite3.Row
        self._conn: sqlite3.Connection | None = conn
        self._writer: GroupCommitWriter[sqlite3.Connection] | None = GroupCommitWriter(
            self._spec.path,
            self._open_writer,
            context=lambda c: c,
            unavailable=SessionStoreError,
            name="session-writer",
        )
        # Coroutines read through one batching reader thread (storage.sqlite.reader);
        # threads read on the shared connection above, under the lock.
        self._reader: GroupReader | None = GroupReader(
            self._open_writer,
            classify=lambda exc: sqlite_files.classify(exc, self._spec, "read"),
            unavailable=lambda msg: SessionStoreError(f"session store {self._spec.path}: {msg}"),
            name="session-reader",
        )

    def _open_writer(self) -> sqlite3.Connection:
        conn = sqlite_files.connect(self._spec)
        conn.row_factory = sqlite3.Row
        return conn

    @property
    def path(self) -> Path:
        return self._path

    @property
    def url(self) -> str:
        return f"sqlite:///{self._spec.path.lstrip('/')}"

    def stats(self) -> dict[str, int]:
        w = self._require_writer()
        return {"writes": w.operations, "commits": w.commits, "durable_commits": w.durable_commits}

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # -- plumbing

    @contextlib.contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """The reader connection inside one read transaction (one consistent snapshot)."""
        with self._lock:
            if self._conn is None:
                raise SessionStoreError(f"session store {self._spec.path} is closed")
            conn = self._conn
            try:
                conn.execute("BEGIN")
                try:
                    yield conn
                finally:
                    conn.execute("COMMIT")
            except sqlite3.Error as exc:
                raise sqlite_files.classify(exc, self._spec, "read") from exc

    def _require_reader(self) -> GroupReader:
        if self._reader is None:
            raise SessionStoreError(f"session store {self._spec.path} is closed")
        return self._reader

    def _require_writer(self) -> GroupCommitWriter[sqlite3.Connection]:
        if self._writer is None:
            raise SessionStoreError(f"session store {self._spec.path} is closed")
        return self._writer

    def _write(self, op: Callable[[sqlite3.Connection], T]) -> T:
        return self._require_writer().write(op)

    async def _awrite(self, op: Callable[[sqlite3.Connection], T]) -> T:
        return await self._require_writer().submit_async(op)

    # -- sessions

    def _create_op(
        self, session_id: str, new: NewSession
    ) -> Callable[[sqlite3.Connection], SessionRecord]:
        now = self._clock()

        def op(conn: sqlite3.Connection) -> SessionRecord:
            if conn.execute(SQL_SESSION_EXISTS, (session_id,)).fetchone() is None:
                _insert_session(conn, session_id, new, now, revive=True)
            elif new.exclusive:
                raise SessionTaken(session_id)
            return _session(conn.execute(SQL_SESSION, (session_id,)).fetchone())

        return op

    def create_session(self, session_id: str, new: NewSession) -> SessionRecord:
        return self._write(self._create_op(session_id, new))

    async def acreate_session(self, session_id: str, new: NewSession) -> SessionRecord:
        return await self._awrite(self._create_op(session_id, new))

    def get_session(self, session_id: str) -> SessionRecord | None:
        with self._read() as conn:
            row = conn.execute(SQL_SESSION, (session_id,)).fetchone()
        return _session(row) if row is not None else None

    def list_sessions(self, limit: int, offset: int) -> list[SessionRecord]:
        with self._read() as conn:
            rows = conn.execute(SQL_LIST_SESSIONS, (limit, offset)).fetchall()
        return [_session(r) for r in rows]

    def find_session_by_key(self, session_key: str) -> SessionRecord | None:
        with self._read() as conn:
            row = conn.execute(SQL_SESSION_BY_KEY, (session_key,)).fetchone()
        return _session(row) if row is not None else None

    async def asessions_by_prefix(self, prefix: str, limit: int) -> PrefixSessions:
        def op(conn: sqlite3.Connection) -> PrefixSessions:
            ids = [
                r["id"]
                for r in conn.execute(
                    SQL_SESSIONS_BY_PREFIX, (prefix, prefix + "_", prefix + "`", limit)
                )
            ]
            transcripts = tuple(
                (sid, tuple(_message(r) for r in conn.execute(SQL_TRANSCRIPT, (sid,))))
                for sid in ids
            )
            deleted = prefix not in ids and (
                conn.execute(SQL_TOMBSTONED, (prefix,)).fetchone() is not None
            )
            return PrefixSessions(transcripts, deleted)

        return await self._require_reader().submit_async(op)

    async def aset_title(self, session_id: str, title: str, *, if_untitled: bool) -> bool:
        sql = SQL_SET_TITLE_IF_UNTITLED if if_untitled else SQL_SET_TITLE

        def op(conn: sqlite3.Connection) -> bool:
            return bool(conn.execute(sql, (title, session_id)).rowcount > 0)

        return await self._awrite(op)

    async def aset_system_prompt(self, session_id: str, prompt: str | None) -> bool:
        def op(conn: sqlite3.Connection) -> bool:
            return bool(conn.execute(SQL_SET_SYSTEM_PROMPT, (prompt, session_id)).rowcount > 0)

        return await self._awrite(op)

    def delete_session(self, session_id: str) -> bool:
        now = self._clock()

        def op(conn: sqlite3.Connection) -> bool:
            conn.execute(SQL_TOMBSTONE, (session_id, now))
            return bool(conn.execute(SQL_DELETE_SESSION, (session_id,)).rowcount > 0)

        return self._write(op)

    # -- messages

    def append_message(self, session_id: str, message: NewMessage) -> MessageRecord:
        now = self._clock()

        def op(conn: sqlite3.Connection) -> MessageRecord:
            _require_live(conn, session_id)
            out = _insert_message(conn, session_id, message, now)
            conn.execute(SQL_TOUCH_SESSION, (now, session_id))
            return out

        return self._write(op)

    def messages(self, session_id: str, after_id: int, limit: int | None) -> list[MessageRecord]:
        with self._read() as conn:
            _require_live(conn, session_id)
            rows = conn.execute(
                SQL_MESSAGES_AFTER, (session_id, after_id, -1 if limit is None else limit)
            ).fetchall()
        return [_message(r) for r in rows]

    def messages_before(self, session_id: str, before_id: int, limit: int) -> list[MessageRecord]:
        with self._read() as conn:
            _require_live(conn, session_id)
            rows = conn.execute(SQL_MESSAGES_BEFORE, (session_id, before_id, limit)).fetchall()
        return [_message(r) for r in reversed(rows)]

    def supersede(self, session_id: str, ids: Sequence[int], how: str) -> int:
        def op(conn: sqlite3.Connection) -> int:
            _require_live(conn, session_id)
            return sum(
                conn.execute(SQL_SUPERSEDE, (how, session_id, message_id)).rowcount
                for message_id in ids
            )

        return self._write(op)

    # -- search

    def search_messages(self, terms: Sequence[str], limit: int) -> list[MessageHit]:
        with self._read() as conn:
            rows = conn.execute(SQL_SEARCH, (fts_query(list(terms)), limit)).fetchall()
        return [MessageHit(r[0], int(r[1]), r[2], float(r[3]), r[4]) for r in rows]

    # -- turns

    def _begin_op(
        self, session_id: str, create: NewSession | None
    ) -> Callable[[sqlite3.Connection], TurnStart]:
        now = self._clock()

        def op(conn: sqlite3.Connection) -> TurnStart:
            # Read again inside the write: a racing turn may have folded meanwhile, and
            # the transaction makes this turn's take disjoint from every other one.
            state = _state(conn, session_id)
            if state != "live":
                if create is None:
                    return TurnStart(state)
                _insert_session(conn, session_id, create, now, revive=True)
            history = tuple(_message(r) for r in conn.execute(SQL_LIVE_TRANSCRIPT, (session_id,)))
            return TurnStart(state, history, tuple(_fold(conn, session_id, now)))

        return op

    async def abegin_turn(self, session_id: str, create: NewSession | None) -> TurnStart:
        peek = await self._require_reader().submit_async(
            functools.partial(_peek_op, session_id=session_id)
        )
        if peek is not None and (peek.state == "live" or create is None):
            return peek
        return await self._awrite(self._begin_op(session_id, create))

    def _append_turn_op(
        self,
        session_id: str,
        messages: Sequence[NewMessage],
        create: NewSession | None,
        idempotency_key: str | None,
        response_json: str | None,
        *,
        rows: bool,
        seen: Sequence[int] = (),
    ) -> Callable[[sqlite3.Connection], list[MessageRecord]]:
        now = self._clock()
        values = [v for m in messages for v in _values(session_id, m, now)]

        def op(conn: sqlite3.Connection) -> list[MessageRecord]:
            if create is not None:
                _insert_session(conn, session_id, create, now, revive=False)
            out: list[MessageRecord] = []
            if rows:
                _require_live(conn, session_id)
                out = [_insert_message(conn, session_id, m, now) for m in messages]
            elif messages:
                # One statement for the whole turn; the foreign key refuses an unknown (or
                # meanwhile deleted) session.
                try:
                    conn.execute(sql_insert_messages(len(messages)), values)
                except sqlite3.IntegrityError as exc:
                    if "FOREIGN KEY" in str(exc):
                        raise SessionGone(session_id) from None
                    raise
            if not conn.execute(SQL_TOUCH_SESSION, (now, session_id)).rowcount:
                raise SessionGone(session_id)
            if idempotency_key is not None:
                conn.execute(SQL_IDEM_DONE, (idempotency_key, session_id, response_json, now, now))
            compacting.mark_seen(conn, "?", session_id, seen, now)
            return out

        return op

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
        return self._write(
            self._append_turn_op(
                session_id, messages, create, idempotency_key, response_json, rows=True, seen=seen
            )
        )

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
        await self._awrite(
            self._append_turn_op(
                session_id, messages, create, idempotency_key, response_json, rows=False, seen=seen
            )
        )

    async def acompact(self, session_id: str, compaction: Compaction) -> MessageRecord | None:
        now = self._clock()

        def op(conn: sqlite3.Connection) -> MessageRecord | None:
            def insert() -> MessageRecord:
                return _insert_message(conn, session_id, compaction.summary, now)

            return compacting.compact(conn, "?", session_id, compaction, now, insert)

        return await self._awrite(op)

    # -- idempotency

    def claim_idempotent(
        self,
        key: str,
        owner: str,
        session_id: str | None,
        takeover: Callable[[str], bool] | None,
    ) -> tuple[IdempotencyRecord, bool]:
        now = self._clock()

        def op(conn: sqlite3.Connection) -> tuple[IdempotencyRecord, bool]:
            row = conn.execute(SQL_IDEM, (key,)).fetchone()
            if row is not None and not (
                row["state"] == "running"
                and row["owner"] != owner
                and takeover is not None
                and takeover(row["owner"] or "")
            ):
                return _idem(row), row["owner"] == owner
            conn.execute(SQL_IDEM_CLAIM, (key, owner, session_id, now, now))
            return _idem(conn.execute(SQL_IDEM, (key,)).fetchone()), True

        return self._write(op)

    def release_idempotent(self, key: str, owner: str) -> bool:
        return self._write(lambda conn: conn.execute(SQL_IDEM_RELEASE, (key, owner)).rowcount > 0)

    # -- running turns and their approvals

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
        return self._write(lambda conn: turns.take_turn(conn, "?", lease, is_dead))

    def renew_turn(self, session_id: str, stream_id: str, ttl_seconds: float) -> bool:
        until = self._clock() + ttl_seconds
        return self._write(lambda conn: turns.renew_turn(conn, "?", session_id, stream_id, until))

    def end_turn(self, session_id: str, stream_id: str) -> bool:
        return self._write(lambda conn: turns.end_turn(conn, "?", session_id, stream_id))

    def running_turns(self) -> list[TurnLease]:
        now = self._clock()
        with self._read() as conn:
            return turns.running_turns(conn, "?", now)

    def ask_approval(self, approval: ApprovalRecord) -> bool:
        return self._write(lambda conn: turns.ask_approval(conn, "?", approval))

    def decide_approval(self, approval_id: str, approve: bool) -> tuple[ApprovalRecord, bool]:
        return self._write(lambda conn: turns.decide_approval(conn, "?", approval_id, approve))

    def expire_approval(self, approval_id: str) -> tuple[ApprovalRecord, bool]:
        return self._write(lambda conn: turns.expire_approval(conn, "?", approval_id))

    def pending_unit_approvals(self) -> list[ApprovalRecord]:
        with self._read() as conn:
            return turns.pending_unit_approvals(conn, "?")

    def get_approval(self, approval_id: str) -> ApprovalRecord | None:
        with self._read() as conn:
            return turns.get_approval(conn, "?", approval_id)

    def pending_approval(self, session_id: str) -> ApprovalRecord | None:
        now = self._clock()
        with self._read() as conn:
            return turns.pending_approval(conn, "?", session_id, now)

    def approval_counts(self) -> dict[str, int]:
        with self._read() as conn:
            return turns.approval_counts(conn)

    # -- retention

    def _prune(self, pick: str, prune: str, before: float, limit: int, dry_run: bool) -> int:
        if dry_run:
            with self._read() as conn:
                return len(conn.execute(pick, (before, int(limit))).fetchall())
        return self._write(lambda conn: int(conn.execute(prune, (before, int(limit))).rowcount))

    def prune_idempotency(self, before: float, limit: int, *, dry_run: bool = False) -> int:
        return self._prune(SQL_PICK_IDEM_DONE, SQL_PRUNE_IDEM, before, limit, dry_run)

    def prune_tombstones(self, before: float, limit: int, *, dry_run: bool = False) -> int:
        return self._prune(SQL_PICK_TOMBSTONES, SQL_PRUNE_TOMBSTONES, before, limit, dry_run)

    def prune_archived_messages(self, before: float, limit: int, *, dry_run: bool = False) -> int:
        return self._prune(*_ARCHIVED, before, limit, dry_run)

    def unfolded_deliveries(self, wanted: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        with self._read() as conn:
            return {
                pair for pair in wanted if conn.execute(SQL_UNFOLDED_BY_DEDUPE, pair).fetchone()
            }


# mypy proves the backend keeps the protocol, without importing it at run time.
if TYPE_CHECKING:
    _conforms: type[SessionBackend] = SqliteSessions
