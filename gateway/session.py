"""Sessions: where a conversation came from, how it is routed, and its durable transcript.

* ``SessionSource`` names the origin of a conversation (platform, chat, thread, user).
* ``build_session_key`` turns a source into the deterministic routing key that completion
  events carry (``session_key``), so a wake-up finds the chat that started the work.
* ``SessionStore`` keeps sessions and their transcripts in SQLite, including the delivery
  rows that background completions leave in API-server sessions and that the next client
  turn folds into its context exactly once.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from delivery.sqlite_writer import GroupCommitWriter
from gateway.config import Platform

T = TypeVar("T")

__all__ = [
    "SessionSource",
    "SessionStore",
    "SessionStoreError",
    "build_session_key",
    "is_valid_session_id",
    "new_session_id",
]

_SESSION_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}")

# Bump when the schema changes; a file written by a newer build is refused rather than
# silently misread.
_SCHEMA_VERSION = 1
_BUSY_TIMEOUT_MS = 5000

_SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS sessions (
        id          TEXT PRIMARY KEY,
        source      TEXT,
        session_key TEXT,
        title       TEXT,
        created_at  REAL NOT NULL,
        updated_at  REAL NOT NULL
    )
    """,
    # AUTOINCREMENT so ids are never reused after deletes: clients page transcripts with
    # ``after_id`` and a reused id could hide a new message behind an old cursor.
    """
    CREATE TABLE IF NOT EXISTS messages (
        id               INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id       TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
        role             TEXT NOT NULL,
        content          TEXT NOT NULL,
        created_at       REAL NOT NULL,
        display_kind     TEXT,
        display_metadata TEXT,
        dedupe_key       TEXT,
        folded_at        REAL,
        UNIQUE (session_id, dedupe_key)
    )
    """,
    "CREATE INDEX IF NOT EXISTS idx_messages_session ON messages (session_id, id)",
    # Folding runs at the start of every client turn; keep it cheap on long transcripts.
    """
    CREATE INDEX IF NOT EXISTS idx_messages_unfolded ON messages (session_id)
        WHERE display_kind IS NOT NULL AND folded_at IS NULL
    """,
    "CREATE INDEX IF NOT EXISTS idx_sessions_updated ON sessions (updated_at)",
    "CREATE INDEX IF NOT EXISTS idx_sessions_key ON sessions (session_key)",
    # Idempotency-Key -> the first response. A "running" row is a claim: a concurrent repeat
    # waits for it instead of starting a second turn. Not tied to a session by a foreign key:
    # the answer to a repeated request must survive even if the session is deleted later.
    """
    CREATE TABLE IF NOT EXISTS idempotency (
        key          TEXT PRIMARY KEY,
        state        TEXT NOT NULL,
        owner        TEXT,
        session_id   TEXT,
        response     TEXT,
        created_at   REAL NOT NULL,
        updated_at   REAL NOT NULL
    )
    """,
)

_REQUIRED_COLUMNS: dict[str, frozenset[str]] = {
    "sessions": frozenset({"id", "source", "session_key", "title", "created_at", "updated_at"}),
    "messages": frozenset(
        {
            "id",
            "session_id",
            "role",
            "content",
            "created_at",
            "display_kind",
            "display_metadata",
            "dedupe_key",
            "folded_at",
        }
    ),
    "idempotency": frozenset(
        {"key", "state", "owner", "session_id", "response", "created_at", "updated_at"}
    ),
}

_MESSAGE_COLUMNS = "id, role, content, created_at, display_kind, display_metadata, folded_at"
_SESSION_COLUMNS = "id, source, session_key, title, created_at, updated_at"


# --------------------------------------------------------------------------- sources


def _coerce_text(value: Any, name: str, *, required: bool) -> str | None:
    if value is None:
        if required:
            raise ValueError(f"SessionSource: missing required field {name!r}")
        return None
    # bool is an int subclass; True as a chat id is always a bug upstream.
    if isinstance(value, bool):
        raise ValueError(f"SessionSource: {name} must be a string, got bool")
    if isinstance(value, int):
        # Platforms such as Telegram hand out numeric ids; the key and JSON want text.
        return str(value)
    if not isinstance(value, str):
        raise ValueError(f"SessionSource: {name} must be a string, got {type(value).__name__}")
    if required and not value:
        raise ValueError(f"SessionSource: {name} must not be empty")
    return value


def _coerce_platform(value: Any) -> Platform:
    try:
        return Platform(value)
    except (ValueError, TypeError):
        known = ", ".join(p.value for p in Platform)
        raise ValueError(
            f"SessionSource: unknown platform {value!r} (expected one of: {known})"
        ) from None


@dataclass
class SessionSource:
    """Where a conversation originates: enough to route a reply or wake-up back to it."""

    platform: Platform
    chat_id: str
    chat_type: str = "dm"
    user_id: str | None = None
    user_name: str | None = None
    thread_id: str | None = None
    chat_name: str | None = None

    def __post_init__(self) -> None:
        # Accept "telegram" as well as Platform.TELEGRAM, and numeric ids, so that a source
        # built by an adapter equals the same source read back from JSON.
        self.platform = _coerce_platform(self.platform)
        for name in ("chat_id", "user_id", "thread_id"):
            value = getattr(self, name)
            if isinstance(value, int) and not isinstance(value, bool):
                setattr(self, name, str(value))

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form; ``from_dict(to_dict())`` returns an equal source."""
        return {
            "platform": self.platform.value,
            "chat_id": self.chat_id,
            "chat_type": self.chat_type,
            "user_id": self.user_id,
            "user_name": self.user_name,
            "thread_id": self.thread_id,
            "chat_name": self.chat_name,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SessionSource:
        """Validate and build a source from persisted or wire data.

        Raises ValueError for a non-mapping, an unknown platform, a missing/empty chat_id or
        wrongly typed fields. Unknown keys are ignored so newer writers stay readable.
        """
        if not isinstance(d, Mapping):
            raise ValueError(f"SessionSource.from_dict expects a mapping, got {type(d).__name__}")
        platform = _coerce_platform(d.get("platform"))
        chat_id = _coerce_text(d.get("chat_id"), "chat_id", required=True)
        chat_type = d.get("chat_type")
        if chat_type is None:
            chat_type = "dm"
        elif not isinstance(chat_type, str) or not chat_type:
            raise ValueError("SessionSource: chat_type must be a non-empty string")
        assert chat_id is not None  # required=True guarantees it; narrows the type
        return cls(
            platform=platform,
            chat_id=chat_id,
            chat_type=chat_type,
            user_id=_coerce_text(d.get("user_id"), "user_id", required=False),
            user_name=_coerce_text(d.get("user_name"), "user_name", required=False),
            thread_id=_coerce_text(d.get("thread_id"), "thread_id", required=False),
            chat_name=_coerce_text(d.get("chat_name"), "chat_name", required=False),
        )


def _escape_key_part(value: str) -> str:
    # A prefix-free substitution (only '%' and ':' change), so the escaped text never
    # contains ':' and decodes uniquely: the key splits back into its exact components and
    # two different sources can never produce the same key.
    return value.replace("%", "%25").replace(":", "%3A")


def build_session_key(source: SessionSource, agent: str = "main") -> str:
    """Deterministic routing key, e.g. ``agent:main:telegram:group:chat-1[:thread:<id>]``.

    Every free-form component is escaped so chat ids containing ':' cannot collide with a
    different chat/thread combination. An empty thread_id counts as "no thread".
    """
    if not agent:
        raise ValueError("build_session_key: agent must be a non-empty string")
    platform = _coerce_platform(source.platform)
    parts = [
        "agent",
        _escape_key_part(agent),
        _escape_key_part(platform.value),
        _escape_key_part(str(source.chat_type)),
        _escape_key_part(str(source.chat_id)),
    ]
    if source.thread_id:
        parts += ["thread", _escape_key_part(str(source.thread_id))]
    return ":".join(parts)


# --------------------------------------------------------------------------- store


def is_valid_session_id(s: object) -> bool:
    """True for 1..128 characters of ``[A-Za-z0-9._:-]`` (safe in headers, URLs and logs)."""
    return isinstance(s, str) and _SESSION_ID_RE.fullmatch(s) is not None


def new_session_id() -> str:
    """A fresh, unguessable session id (``sess_`` + 32 hex chars)."""
    return "sess_" + secrets.token_hex(16)


class SessionGone(LookupError):
    """The session does not exist (never created, or deleted): a delivery to it is dropped.

    A domain error rather than the built-in ``KeyError``, so that a stray ``KeyError`` from a
    bug can never be mistaken for "the session is gone" and drop a result for good.
    """

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} does not exist")
        self.session_id = session_id


class SessionStoreError(RuntimeError):
    """The session database cannot be used (not a database, newer schema, closed...)."""


def _create_private_file(path: Path) -> None:
    # Create the file ourselves so it is born 0600: transcripts hold private conversations
    # and SQLite would otherwise create it with the process umask (often 0644). SQLite gives
    # the -wal/-shm side files the main file's mode. An existing file is left untouched.
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return
    os.close(fd)


def _message_values(session_id: str, message: Mapping[str, Any], now: float) -> tuple[Any, ...]:
    role, content = message.get("role"), message.get("content")
    if not isinstance(role, str) or not role:
        raise ValueError("role must be a non-empty string")
    if not isinstance(content, str):
        raise TypeError(f"content must be a string, got {type(content).__name__}")
    meta = message.get("display_metadata")
    meta_json = json.dumps(dict(meta), ensure_ascii=False) if meta is not None else None
    return (
        session_id,
        role,
        content,
        now,
        message.get("display_kind"),
        meta_json,
        message.get("dedupe_key"),
    )


def _fold(conn: sqlite3.Connection, rows: list[dict[str, Any]], now: float) -> list[dict[str, Any]]:
    """Mark delivery rows folded into a turn (inside the caller's transaction)."""
    if rows:
        conn.executemany(
            "UPDATE messages SET folded_at = ? WHERE id = ? AND folded_at IS NULL",
            [(now, row["id"]) for row in rows],
        )
    return [{**row, "folded": True} for row in rows]


class SessionStore:
    """Sessions and transcript messages in one SQLite file.

    Concurrency: writes go to one writer thread (``delivery.sqlite_writer``) that runs every
    waiting write in one ``BEGIN IMMEDIATE`` transaction with a busy timeout and commits
    once, so concurrent turns share fsyncs and several stores (or processes) on one file stay
    atomic. Reads share one connection guarded by a lock; WAL lets them run beside the writer.

    Methods are synchronous; the hot write paths also have ``a``-prefixed coroutine twins that
    await the writer without a thread hop. Other async callers use ``asyncio.to_thread``.
    """

    def __init__(self, path: str | Path) -> None:
        self._path = Path(path)
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        try:
            # 0700 only applies to directories we create; transcripts are private.
            self._path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            _create_private_file(self._path)
            conn = sqlite3.connect(
                str(self._path),
                timeout=_BUSY_TIMEOUT_MS / 1000,
                isolation_level=None,  # explicit BEGIN/COMMIT below, no implicit txns
                check_same_thread=False,  # guarded by self._lock instead
            )
        except (OSError, sqlite3.Error) as exc:
            raise SessionStoreError(f"cannot open session store {self._path}: {exc}") from exc
        conn.row_factory = sqlite3.Row
        try:
            self._prepare(conn)
        except SessionStoreError:
            conn.close()
            raise
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise SessionStoreError(
                f"{self._path} is not a usable SQLite database ({exc}); "
                "refusing to modify it — move it aside or point the store elsewhere"
            ) from exc
        self._conn = conn
        # Writes go through one writer thread that commits concurrent writes together:
        # 32 API turns at once share a handful of fsyncs instead of queueing for one each.
        self._writer: GroupCommitWriter[sqlite3.Connection] | None = GroupCommitWriter(
            str(self._path),
            self._open_writer,
            context=lambda c: c,
            unavailable=SessionStoreError,
            name="session-writer",
        )

    @property
    def path(self) -> Path:
        return self._path

    # ----------------------------------------------------------------- lifecycle

    def _prepare(self, conn: sqlite3.Connection) -> None:
        # A read first: on a foreign file it fails with "file is not a database" before any
        # pragma or DDL could write to it.
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > _SCHEMA_VERSION:
            raise SessionStoreError(
                f"{self._path} has session schema v{version}, newer than this build "
                f"(v{_SCHEMA_VERSION}); upgrade Reveille instead of downgrading the data"
            )
        # Before any pragma or DDL: switching someone else's database to WAL or adding our
        # tables to it would already be a modification.
        for table, required in _REQUIRED_COLUMNS.items():
            have = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
            missing = required - have
            if have and missing:
                raise SessionStoreError(
                    f"{self._path}: table {table!r} exists but lacks columns "
                    f"{sorted(missing)}; this file belongs to something else"
                )
        conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA journal_mode = WAL").fetchone()
        # FULL: an acknowledged delivery row must survive power loss, or a completion that
        # was marked delivered could vanish from the transcript.
        conn.execute("PRAGMA synchronous = FULL")
        # Off by default in SQLite; needed for ON DELETE CASCADE of transcripts.
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("BEGIN IMMEDIATE")
        try:
            for stmt in _SCHEMA:
                conn.execute(stmt)
            conn.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def close(self) -> None:
        """Close the connection; idempotent. Further calls raise SessionStoreError."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> SessionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _require_conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise SessionStoreError(f"session store {self._path} is closed")
        return self._conn

    @contextlib.contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            yield self._require_conn()

    def _write(self, op: Callable[[sqlite3.Connection], T]) -> T:
        return self._require_writer().write(op)

    async def _awrite(self, op: Callable[[sqlite3.Connection], T]) -> T:
        return await self._require_writer().submit_async(op)

    def _require_writer(self) -> GroupCommitWriter[sqlite3.Connection]:
        if self._writer is None:
            raise SessionStoreError(f"session store {self._path} is closed")
        return self._writer

    def _open_writer(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            str(self._path),
            timeout=_BUSY_TIMEOUT_MS / 1000,
            isolation_level=None,
            check_same_thread=False,
        )
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA foreign_keys = ON")
        return conn

    # ----------------------------------------------------------------- sessions

    @staticmethod
    def _session_dict(row: sqlite3.Row) -> dict[str, Any]:
        return {
            "id": row["id"],
            "source": json.loads(row["source"]) if row["source"] is not None else None,
            "session_key": row["session_key"],
            "title": row["title"],
            "created_at": row["created_at"],
            "updated_at": row["updated_at"],
        }

    def create_session(
        self,
        session_id: str | None = None,
        *,
        source: SessionSource | None = None,
        title: str | None = None,
    ) -> dict[str, Any]:
        """Create a session, or return the existing one with that id unchanged."""
        return self._write(self._create_session_op(session_id, source, title))

    async def acreate_session(
        self,
        session_id: str | None = None,
        *,
        source: SessionSource | None = None,
        title: str | None = None,
    ) -> dict[str, Any]:
        return await self._awrite(self._create_session_op(session_id, source, title))

    def _create_session_op(
        self, session_id: str | None, source: SessionSource | None, title: str | None
    ) -> Callable[[sqlite3.Connection], dict[str, Any]]:
        if session_id is None:
            session_id = new_session_id()
        elif not is_valid_session_id(session_id):
            raise ValueError(f"invalid session id {session_id!r}")
        if source is not None and not isinstance(source, SessionSource):
            raise TypeError(f"source must be a SessionSource, got {type(source).__name__}")
        source_json = json.dumps(source.to_dict(), sort_keys=True) if source else None
        session_key = build_session_key(source) if source else None
        now = time.time()

        def op(conn: sqlite3.Connection) -> dict[str, Any]:
            conn.execute(
                "INSERT INTO sessions (id, source, session_key, title, created_at, updated_at)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
                (session_id, source_json, session_key, title, now, now),
            )
            row = conn.execute(
                f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE id = ?", (session_id,)
            ).fetchone()
            return self._session_dict(row)

        return op

    def get_session(self, session_id: str) -> dict[str, Any] | None:
        with self._read() as conn:
            row = conn.execute(
                f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE id = ?", (session_id,)
            ).fetchone()
        return self._session_dict(row) if row is not None else None

    def list_sessions(self, limit: int = 100, offset: int = 0) -> list[dict[str, Any]]:
        """Most recently active first."""
        if limit < 0 or offset < 0:
            raise ValueError("limit and offset must be >= 0")
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT {_SESSION_COLUMNS} FROM sessions"
                " ORDER BY updated_at DESC, id ASC LIMIT ? OFFSET ?",
                (limit, offset),
            ).fetchall()
        return [self._session_dict(r) for r in rows]

    def delete_session(self, session_id: str) -> bool:
        """Delete a session and (by cascade) its transcript. False when it did not exist."""
        return self._write(
            lambda conn: (
                conn.execute("DELETE FROM sessions WHERE id = ?", (session_id,)).rowcount > 0
            )
        )

    # ----------------------------------------------------------------- messages

    @staticmethod
    def _message_dict(row: sqlite3.Row) -> dict[str, Any]:
        meta = row["display_metadata"]
        return {
            "id": row["id"],
            "role": row["role"],
            "content": row["content"],
            "created_at": row["created_at"],
            "display_kind": row["display_kind"],
            "display_metadata": json.loads(meta) if meta is not None else None,
            "folded": row["folded_at"] is not None,
        }

    @staticmethod
    def _require_session(conn: sqlite3.Connection, session_id: str) -> None:
        if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is None:
            raise SessionGone(session_id)

    def append_message(
        self,
        session_id: str,
        role: str,
        content: str,
        *,
        display_kind: str | None = None,
        display_metadata: Mapping[str, Any] | None = None,
        dedupe_key: str | None = None,
    ) -> dict[str, Any]:
        """Append a transcript message and return it.

        With a ``dedupe_key`` already used in this session, nothing is inserted and the
        existing row is returned: a redelivered completion never shows up twice.
        Raises SessionGone for an unknown session.
        """
        message = {
            "role": role,
            "content": content,
            "display_kind": display_kind,
            "display_metadata": display_metadata,
            "dedupe_key": dedupe_key,
        }
        now = time.time()
        _message_values(session_id, message, now)  # a bad payload fails before any write

        def op(conn: sqlite3.Connection) -> dict[str, Any]:
            self._require_session(conn, session_id)
            out = self._insert_message(conn, session_id, message, now)
            conn.execute("UPDATE sessions SET updated_at = ? WHERE id = ?", (now, session_id))
            return out

        return self._write(op)

    def messages(
        self, session_id: str, *, after_id: int = 0, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """Transcript in order, only ids > ``after_id``. Raises SessionGone for unknown sessions."""
        if limit is not None and limit < 0:
            raise ValueError("limit must be >= 0")
        with self._read() as conn:
            self._require_session(conn, session_id)
            rows = conn.execute(
                f"SELECT {_MESSAGE_COLUMNS} FROM messages"
                " WHERE session_id = ? AND id > ? ORDER BY id LIMIT ?",
                (session_id, after_id, -1 if limit is None else limit),
            ).fetchall()
        return [self._message_dict(r) for r in rows]

    def take_unfolded_deliveries(self, session_id: str) -> list[dict[str, Any]]:
        """Mark every not-yet-folded delivery row as folded and return them, oldest first.

        Select and update happen in one IMMEDIATE transaction, so concurrent callers (threads,
        stores or processes) each get a disjoint set: every delivery row is folded into
        exactly one client turn. Raises SessionGone for unknown sessions.
        """
        return self._write(self._take_unfolded_op(session_id))

    def _take_unfolded_op(
        self, session_id: str
    ) -> Callable[[sqlite3.Connection], list[dict[str, Any]]]:
        now = time.time()

        def op(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            self._require_session(conn, session_id)
            rows = conn.execute(
                f"SELECT {_MESSAGE_COLUMNS} FROM messages"
                " WHERE session_id = ? AND display_kind IS NOT NULL AND folded_at IS NULL"
                " ORDER BY id",
                (session_id,),
            ).fetchall()
            return _fold(conn, [self._message_dict(r) for r in rows], now)

        return op

    async def abegin_turn(
        self,
        session_id: str,
        *,
        create_with: SessionSource | None = None,
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Everything a turn needs from the store before it runs, in one writer operation.

        Creates the session first when ``create_with`` is given (an existing one is kept),
        then returns ``(transcript, taken)``: the transcript in order, and the delivery rows
        this turn folds (marked folded now, so each is folded into exactly one turn).
        Raises SessionGone for an unknown session. Nothing changed means nothing to fsync.
        """
        if not is_valid_session_id(session_id):
            raise ValueError(f"invalid session id {session_id!r}")
        now = time.time()
        created = (
            (
                session_id,
                json.dumps(create_with.to_dict(), sort_keys=True),
                build_session_key(create_with),
                now,
                now,
            )
            if create_with is not None
            else None
        )

        def op(conn: sqlite3.Connection) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
            if created is not None:
                conn.execute(
                    "INSERT INTO sessions (id, source, session_key, title, created_at,"
                    " updated_at) VALUES (?, ?, ?, NULL, ?, ?) ON CONFLICT (id) DO NOTHING",
                    created,
                )
            else:
                self._require_session(conn, session_id)
            rows = conn.execute(
                f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE session_id = ? ORDER BY id",
                (session_id,),
            ).fetchall()
            history = [self._message_dict(r) for r in rows]
            unfolded = [m for m in history if m["display_kind"] is not None and not m["folded"]]
            return history, _fold(conn, unfolded, now)

        return await self._awrite(op)

    def find_session_by_key(self, session_key: str) -> dict[str, Any] | None:
        """The most recently active session with this routing key, or None."""
        with self._read() as conn:
            row = conn.execute(
                f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE session_key = ?"
                " ORDER BY updated_at DESC, id ASC LIMIT 1",
                (session_key,),
            ).fetchone()
        return self._session_dict(row) if row is not None else None

    # ----------------------------------------------------------------- turns

    @staticmethod
    def _insert_message(
        conn: sqlite3.Connection, session_id: str, message: Mapping[str, Any], now: float
    ) -> dict[str, Any]:
        values = _message_values(session_id, message, now)
        row = conn.execute(
            "INSERT INTO messages (session_id, role, content, created_at, display_kind,"
            " display_metadata, dedupe_key) VALUES (?, ?, ?, ?, ?, ?, ?)"
            f" ON CONFLICT (session_id, dedupe_key) DO NOTHING RETURNING {_MESSAGE_COLUMNS}",
            values,
        ).fetchone()
        if row is None:
            row = conn.execute(
                f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE session_id = ? AND dedupe_key = ?",
                (session_id, values[-1]),
            ).fetchone()
        return SessionStore._message_dict(row)

    def append_turn(
        self,
        session_id: str,
        messages: list[Mapping[str, Any]],
        *,
        idempotency_key: str | None = None,
        response: Mapping[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        """Append a turn's messages and, with ``idempotency_key``, record its response.

        One transaction: after a crash either the whole turn and its idempotency record are
        there (a repeated request gets the stored response) or neither is (the repeat runs
        the turn). Each message is a mapping with ``role`` and ``content`` and optionally
        ``display_kind``, ``display_metadata``, ``dedupe_key``. Raises SessionGone for an
        unknown session; nothing is written then.
        """
        return self._write(self._append_turn_op(session_id, messages, idempotency_key, response))

    async def aappend_turn(
        self,
        session_id: str,
        messages: list[Mapping[str, Any]],
        *,
        idempotency_key: str | None = None,
        response: Mapping[str, Any] | None = None,
    ) -> None:
        """Like ``append_turn``, awaited without a thread hop; returns nothing.

        The turn goes in as one statement, and the rows are not read back.
        """
        await self._awrite(
            self._append_turn_op(session_id, messages, idempotency_key, response, rows=False)
        )

    def _append_turn_op(
        self,
        session_id: str,
        messages: list[Mapping[str, Any]],
        idempotency_key: str | None,
        response: Mapping[str, Any] | None,
        *,
        rows: bool = True,
    ) -> Callable[[sqlite3.Connection], list[dict[str, Any]]]:
        response_json = (
            json.dumps(dict(response), ensure_ascii=False) if response is not None else None
        )
        now = time.time()
        values = [_message_values(session_id, m, now) for m in messages]
        insert = (
            "INSERT INTO messages (session_id, role, content, created_at, display_kind,"
            " display_metadata, dedupe_key) VALUES "
            + ", ".join(["(?, ?, ?, ?, ?, ?, ?)"] * len(values))
            + " ON CONFLICT (session_id, dedupe_key) DO NOTHING"
        )

        def op(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            if rows:
                self._require_session(conn, session_id)
                out = [self._insert_message(conn, session_id, m, now) for m in messages]
            else:
                # One statement for the whole turn; the foreign key refuses an unknown
                # (or meanwhile deleted) session.
                out = []
                if values:
                    try:
                        conn.execute(insert, [v for row in values for v in row])
                    except sqlite3.IntegrityError as exc:
                        if "FOREIGN KEY" in str(exc):
                            raise SessionGone(session_id) from None
                        raise
            if not conn.execute(
                "UPDATE sessions SET updated_at = ? WHERE id = ?", (now, session_id)
            ).rowcount:
                raise SessionGone(session_id)
            if idempotency_key is not None:
                self._store_idempotent(conn, idempotency_key, session_id, response_json, now)
            return out

        return op

    # ----------------------------------------------------------------- idempotency

    @staticmethod
    def _idem_dict(row: sqlite3.Row) -> dict[str, Any]:
        return {
            "key": row["key"],
            "state": row["state"],
            "owner": row["owner"],
            "session_id": row["session_id"],
            "response": json.loads(row["response"]) if row["response"] is not None else None,
            "created_at": row["created_at"],
            "updated_at": row["updated_at"],
        }

    @staticmethod
    def _store_idempotent(
        conn: sqlite3.Connection,
        key: str,
        session_id: str | None,
        response_json: str | None,
        now: float,
    ) -> None:
        conn.execute(
            "INSERT INTO idempotency (key, state, owner, session_id, response, created_at,"
            " updated_at) VALUES (?, 'done', NULL, ?, ?, ?, ?)"
            " ON CONFLICT (key) DO UPDATE SET state = 'done', owner = NULL,"
            " session_id = excluded.session_id, response = excluded.response,"
            " updated_at = excluded.updated_at",
            (key, session_id, response_json, now, now),
        )

    def get_idempotent(self, key: str) -> dict[str, Any] | None:
        """``{"state": "running" | "done", "response", "session_id", "owner", ...}`` or None."""
        with self._read() as conn:
            row = conn.execute("SELECT * FROM idempotency WHERE key = ?", (key,)).fetchone()
        return self._idem_dict(row) if row is not None else None

    def claim_idempotent(
        self,
        key: str,
        owner: str,
        *,
        session_id: str | None = None,
        takeover: Callable[[str], bool] | None = None,
    ) -> dict[str, Any]:
        """Claim ``key`` for a first run, atomically.

        Returns the row with ``"claimed": True`` when the caller now runs the request, or
        the existing row with ``"claimed": False`` (state "done": replay its response;
        "running": someone else runs it, wait). A "running" row whose owner
        ``takeover(owner)`` declares gone (a crashed process) is taken over.
        """
        if not isinstance(key, str) or not key:
            raise ValueError("an idempotency key must be a non-empty string")
        now = time.time()

        def op(conn: sqlite3.Connection) -> dict[str, Any]:
            row = conn.execute("SELECT * FROM idempotency WHERE key = ?", (key,)).fetchone()
            if row is not None and not (
                row["state"] == "running"
                and row["owner"] != owner
                and takeover is not None
                and takeover(row["owner"] or "")
            ):
                return {**self._idem_dict(row), "claimed": row["owner"] == owner}
            conn.execute(
                "INSERT INTO idempotency (key, state, owner, session_id, response, created_at,"
                " updated_at) VALUES (?, 'running', ?, ?, NULL, ?, ?)"
                " ON CONFLICT (key) DO UPDATE SET state = 'running', owner = excluded.owner,"
                " session_id = excluded.session_id, updated_at = excluded.updated_at",
                (key, owner, session_id, now, now),
            )
            row = conn.execute("SELECT * FROM idempotency WHERE key = ?", (key,)).fetchone()
            return {**self._idem_dict(row), "claimed": True}

        return self._write(op)

    def put_idempotent(
        self, key: str, response: Mapping[str, Any], *, session_id: str | None = None
    ) -> None:
        """Record the response of ``key``: every repeat gets it from now on."""
        response_json = json.dumps(dict(response), ensure_ascii=False)
        now = time.time()
        self._write(lambda conn: self._store_idempotent(conn, key, session_id, response_json, now))

    def release_idempotent(self, key: str, owner: str) -> bool:
        """Forget a running claim (the request failed), so a repeat may run it again."""
        return self._write(
            lambda conn: (
                conn.execute(
                    "DELETE FROM idempotency WHERE key = ? AND state = 'running' AND owner = ?",
                    (key, owner),
                ).rowcount
                > 0
            )
        )
