"""The SQL of the SQLite session backend: its schema and every statement, named.

Kept apart from ``storage.sqlite.sessions`` so the statements read as one list (and the
backend as logic). Column lists are spelled once; nothing here formats SQL at run time
except ``sql_insert_messages``, whose few shapes are cached.
"""

from __future__ import annotations

import functools

from storage.sqlite.fts import TextIndex

# v2 added the tombstones table, v3 running_turns and approvals, v4 compaction's columns of
# messages (seen_at, archived_at, summary_id), v5 RETENTION_DDL (the indexes retention reads
# by age), v6 MESSAGES_INDEX (full-text search over messages) and sessions.system_prompt. A file
# written by a newer build is refused rather than silently misread; an older file gains the
# tables (and ``UPGRADE_COLUMNS``) on open.
SCHEMA_VERSION = 6

# Columns added to existing tables since v1, in order: (table, column, type). Added on open
# when missing (``storage.sqlite.sessions``), before the DDL's indexes that name them.
UPGRADE_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("messages", "seen_at", "REAL"),
    ("messages", "archived_at", "REAL"),
    ("messages", "summary_id", "INTEGER"),
    # background units' approvals (no turn lease): the unit, its process, its deadline
    ("approvals", "unit_id", "TEXT NOT NULL DEFAULT ''"),
    ("approvals", "owner", "TEXT NOT NULL DEFAULT ''"),
    ("approvals", "expires_at", "REAL NOT NULL DEFAULT 0"),
    ("sessions", "system_prompt", "TEXT"),  # v6: a chat's own system prompt
)

DDL = """
CREATE TABLE IF NOT EXISTS sessions (
    id          TEXT PRIMARY KEY,
    source      TEXT,
    session_key TEXT,
    title       TEXT,
    created_at  REAL NOT NULL,
    updated_at  REAL NOT NULL,
    system_prompt TEXT
);
-- AUTOINCREMENT so ids are never reused after deletes: clients page transcripts with
-- after_id and a reused id could hide a new message behind an old cursor.
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
    -- compaction: a stored turn saw this delivery row; a summary replaced this row in the
    -- model's context (kept: archived rows are pruned only by an explicit retention policy)
    seen_at          REAL,
    archived_at      REAL,
    summary_id       INTEGER,
    UNIQUE (session_id, dedupe_key)
);
CREATE INDEX IF NOT EXISTS idx_messages_session ON messages (session_id, id);
-- Folding is checked at the start of every client turn; keep it cheap on long transcripts.
CREATE INDEX IF NOT EXISTS idx_messages_unfolded ON messages (session_id)
    WHERE display_kind IS NOT NULL AND folded_at IS NULL;
CREATE INDEX IF NOT EXISTS idx_messages_live ON messages (session_id, id)
    WHERE archived_at IS NULL;
CREATE INDEX IF NOT EXISTS idx_sessions_updated ON sessions (updated_at);
CREATE INDEX IF NOT EXISTS idx_sessions_key ON sessions (session_key);
-- Idempotency-Key -> the first response. A 'running' row is a claim. Not tied to a session
-- by a foreign key: the answer to a repeated request must survive the session's deletion.
CREATE TABLE IF NOT EXISTS idempotency (
    key          TEXT PRIMARY KEY,
    state        TEXT NOT NULL,
    owner        TEXT,
    session_id   TEXT,
    response     TEXT,
    created_at   REAL NOT NULL,
    updated_at   REAL NOT NULL
);
-- Deleted ids: a late write of a turn that began before the delete must not recreate them.
CREATE TABLE IF NOT EXISTS tombstones (
    id         TEXT PRIMARY KEY,
    deleted_at REAL NOT NULL
);
-- A session's running turn, as a lease: the session is busy on every server while it lives.
CREATE TABLE IF NOT EXISTS running_turns (
    session_id TEXT PRIMARY KEY,
    stream_id  TEXT NOT NULL,
    owner      TEXT NOT NULL,
    wakeup     INTEGER NOT NULL,
    started_at REAL NOT NULL,
    expires_at REAL NOT NULL
);
-- Human confirmations asked by running turns; pending only while the asking turn runs.
-- A background unit's (unit_id set, stream_id empty) holds no turn; it expires instead.
CREATE TABLE IF NOT EXISTS approvals (
    id         TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    stream_id  TEXT NOT NULL,
    command    TEXT NOT NULL,
    status     TEXT NOT NULL,
    created_at REAL NOT NULL,
    unit_id    TEXT NOT NULL DEFAULT '',
    owner      TEXT NOT NULL DEFAULT '',
    expires_at REAL NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS idx_approvals_session ON approvals (session_id, stream_id)
"""

# v5 (retention): what retention reads by age. IF NOT EXISTS: an older file gains them on open.
RETENTION_DDL = """
CREATE INDEX IF NOT EXISTS idx_idempotency_done ON idempotency (updated_at) WHERE state = 'done';
CREATE INDEX IF NOT EXISTS idx_tombstones_deleted ON tombstones (deleted_at)
"""

# v6 (search): an FTS5 index over messages' text (``storage.sqlite.fts``), kept in step by
# triggers in the same transaction as every insert, delete (a session's, by cascade, and
# retention's) and edit, and built with the rows already there by whichever process opens
# an older file first.
MESSAGES_INDEX = TextIndex("messages_fts", "messages", "content", key="id")
# \x02 and \x03 mark the matched words (``delivery.session_backend.SNIPPET_START``/_END).
SQL_SEARCH = (
    "SELECT m.session_id, m.id, m.role, m.created_at,"
    " snippet(messages_fts, 0, char(2), char(3), '\u2026', 12)"
    " FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid"
    " WHERE messages_fts MATCH ? ORDER BY messages_fts.rowid DESC LIMIT ?"
)


REQUIRED_COLUMNS: dict[str, frozenset[str]] = {
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
    "tombstones": frozenset({"id", "deleted_at"}),
    "running_turns": frozenset(
        {"session_id", "stream_id", "owner", "wakeup", "started_at", "expires_at"}
    ),
    "approvals": frozenset({"id", "session_id", "stream_id", "command", "status", "created_at"}),
}

_MSG = (
    "id, role, content, created_at, display_kind, display_metadata, folded_at,"
    " seen_at, archived_at, summary_id"
)
_SES = "id, source, session_key, title, created_at, updated_at"
_SES_READ = _SES + ", system_prompt"
_IDEM = "key, state, owner, session_id, response, created_at, updated_at"
_MSG_VALUES = "(?, ?, ?, ?, ?, ?, ?)"

# -- named queries
SQL_SESSION = f"SELECT {_SES_READ} FROM sessions WHERE id = ?"
SQL_SESSION_EXISTS = "SELECT 1 FROM sessions WHERE id = ?"
SQL_TOMBSTONED = "SELECT 1 FROM tombstones WHERE id = ?"
SQL_INSERT_SESSION = (
    f"INSERT INTO sessions ({_SES}) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING"
)
SQL_LIST_SESSIONS = (
    f"SELECT {_SES_READ} FROM sessions ORDER BY updated_at DESC, id ASC LIMIT ? OFFSET ?"
)
_NEWEST_FIRST = "ORDER BY updated_at DESC, id ASC"
SQL_SESSION_BY_KEY = (
    f"SELECT {_SES_READ} FROM sessions WHERE session_key = ? {_NEWEST_FIRST} LIMIT 1"
)
# A range on the primary key: ids equal to the prefix or starting with prefix + "_"
# ("_" < "`", so [prefix, prefix + "`") holds exactly those and the prefix itself).
SQL_SESSIONS_BY_PREFIX = (
    "SELECT id FROM sessions WHERE id = ? OR (id > ? AND id < ?) ORDER BY created_at, id LIMIT ?"
)
SQL_TOUCH_SESSION = "UPDATE sessions SET updated_at = ? WHERE id = ?"
SQL_DELETE_SESSION = "DELETE FROM sessions WHERE id = ?"
SQL_SET_TITLE = "UPDATE sessions SET title = ? WHERE id = ?"
SQL_SET_TITLE_IF_UNTITLED = "UPDATE sessions SET title = ? WHERE id = ? AND title IS NULL"
SQL_SET_SYSTEM_PROMPT = "UPDATE sessions SET system_prompt = ? WHERE id = ?"
SQL_SUPERSEDE = (
    "UPDATE messages SET display_metadata ="
    " json_set(COALESCE(display_metadata, '{}'), '$.superseded', ?)"
    " WHERE session_id = ? AND id = ? AND display_kind IS NULL"
)
SQL_TOMBSTONE = (
    "INSERT INTO tombstones (id, deleted_at) VALUES (?, ?)"
    " ON CONFLICT (id) DO UPDATE SET deleted_at = excluded.deleted_at"
)
SQL_UNTOMBSTONE = "DELETE FROM tombstones WHERE id = ?"
SQL_INSERT_MESSAGE = (
    "INSERT INTO messages (session_id, role, content, created_at, display_kind,"
    f" display_metadata, dedupe_key) VALUES {_MSG_VALUES}"
    f" ON CONFLICT (session_id, dedupe_key) DO NOTHING RETURNING {_MSG}"
)
SQL_MESSAGE_BY_DEDUPE = f"SELECT {_MSG} FROM messages WHERE session_id = ? AND dedupe_key = ?"
SQL_MESSAGES_AFTER = (
    f"SELECT {_MSG} FROM messages WHERE session_id = ? AND id > ? ORDER BY id LIMIT ?"
)
SQL_MESSAGES_BEFORE = (
    f"SELECT {_MSG} FROM messages WHERE session_id = ? AND id < ? ORDER BY id DESC LIMIT ?"
)
SQL_TRANSCRIPT = f"SELECT {_MSG} FROM messages WHERE session_id = ? ORDER BY id"
# What a turn reads: the transcript less the rows a compaction archived (a long session's
# turn reads its summary and its newest rows, not every row it ever had).
SQL_LIVE_TRANSCRIPT = (
    f"SELECT {_MSG} FROM messages WHERE session_id = ? AND archived_at IS NULL ORDER BY id"
)
SQL_UNFOLDED = (
    f"SELECT {_MSG} FROM messages"
    " WHERE session_id = ? AND display_kind IS NOT NULL AND folded_at IS NULL ORDER BY id"
)
SQL_FOLD = "UPDATE messages SET folded_at = ? WHERE id = ? AND folded_at IS NULL"
SQL_IDEM = f"SELECT {_IDEM} FROM idempotency WHERE key = ?"
SQL_IDEM_DONE = (
    f"INSERT INTO idempotency ({_IDEM}) VALUES (?, 'done', NULL, ?, ?, ?, ?)"
    " ON CONFLICT (key) DO UPDATE SET state = 'done', owner = NULL,"
    " session_id = excluded.session_id, response = excluded.response,"
    " updated_at = excluded.updated_at"
)
SQL_IDEM_CLAIM = (
    f"INSERT INTO idempotency ({_IDEM}) VALUES (?, 'running', ?, ?, NULL, ?, ?)"
    " ON CONFLICT (key) DO UPDATE SET state = 'running', owner = excluded.owner,"
    " session_id = excluded.session_id, updated_at = excluded.updated_at"
)
SQL_IDEM_RELEASE = "DELETE FROM idempotency WHERE key = ? AND state = 'running' AND owner = ?"


@functools.lru_cache(maxsize=16)
def sql_insert_messages(n: int) -> str:
    """One INSERT for a whole turn of ``n`` messages (turns are short: few shapes)."""
    return (
        "INSERT INTO messages (session_id, role, content, created_at, display_kind,"
        " display_metadata, dedupe_key) VALUES "
        + ", ".join([_MSG_VALUES] * n)
        + " ON CONFLICT (session_id, dedupe_key) DO NOTHING"
    )


# -- retention (each takes before, limit)
SQL_PICK_IDEM_DONE = (
    "SELECT key FROM idempotency WHERE state = 'done' AND updated_at < ?"
    " ORDER BY updated_at LIMIT ?"
)
SQL_PRUNE_IDEM = f"DELETE FROM idempotency WHERE state = 'done' AND key IN ({SQL_PICK_IDEM_DONE})"
SQL_PICK_TOMBSTONES = "SELECT id FROM tombstones WHERE deleted_at < ? ORDER BY deleted_at LIMIT ?"
SQL_PRUNE_TOMBSTONES = f"DELETE FROM tombstones WHERE id IN ({SQL_PICK_TOMBSTONES})"
SQL_UNFOLDED_BY_DEDUPE = (
    "SELECT 1 FROM messages WHERE session_id = ? AND dedupe_key = ?"
    " AND display_kind IS NOT NULL AND folded_at IS NULL"
)
