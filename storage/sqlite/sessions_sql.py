"""The SQL of the SQLite session backend: its schema, and the statements of its own.

Only what SQLite spells its own way: the statements both SQL dialects share are
``storage.session_sql``'s. Nothing here formats SQL at run time except
``sql_insert_messages``, whose few shapes are cached.
"""

from __future__ import annotations

import functools

from storage.session_sql import insert_messages_sql, insert_new_session_sql
from storage.sqlite.fts import TextIndex

# v2 added the tombstones table, v3 running_turns and approvals, v4 compaction's columns of
# messages (seen_at, archived_at, summary_id), v5 RETENTION_DDL (the indexes retention reads
# by age), v6 MESSAGES_INDEX (full-text search over messages) and sessions.system_prompt,
# v7 sessions.metadata (``/v1/conversations``). A file written by a newer build is refused
# rather than silently misread; an older file gains the tables (and ``UPGRADE_COLUMNS``) on
# open.
SCHEMA_VERSION = 7

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
    ("sessions", "metadata", "TEXT"),  # v7: an API conversation's metadata (JSON)
    # an MCP server's form and the values it was approved with (tools.mcp.elicitation)
    ("approvals", "form", "TEXT NOT NULL DEFAULT ''"),
    ("approvals", "answer", "TEXT NOT NULL DEFAULT ''"),
)

DDL = """
CREATE TABLE IF NOT EXISTS sessions (
    id          TEXT PRIMARY KEY,
    source      TEXT,
    session_key TEXT,
    title       TEXT,
    created_at  REAL NOT NULL,
    updated_at  REAL NOT NULL,
    system_prompt TEXT,
    metadata    TEXT
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
    expires_at REAL NOT NULL DEFAULT 0,
    form       TEXT NOT NULL DEFAULT '',
    answer     TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS idx_approvals_session ON approvals (session_id, stream_id)
"""

# v5 (retention): what retention reads by age. IF NOT EXISTS: an older file gains them on open.
RETENTION_DDL = """
CREATE INDEX IF NOT EXISTS idx_idempotency_done ON idempotency (updated_at) WHERE state = 'done';
CREATE INDEX IF NOT EXISTS idx_tombstones_deleted ON tombstones (deleted_at)
"""

# v6 (search): an FTS5 index over messages' text (``storage.sqlite.fts``), built with the rows
# already there by whichever process opens an older file first. It is batched: a turn's
# messages are indexed with the messages written after them, ``MESSAGES_BATCH`` at a time, by
# an operation the writer thread commits after the turn that filled the batch, and before
# any search (``SqliteSessions.search_messages``), so no search misses a message; a turn's
# commit no longer tokenizes its text and writes the index's pages (a tenth of the server's
# CPU per demo turn: 0.385 -> 0.345 ms). Triggers keep the messages indexed so
# far in step with every delete (a session's, by cascade, and retention's) and edit, in
# the same transaction. A file with the per-insert triggers gets the guarded ones on open.
MESSAGES_INDEX = TextIndex("messages_fts", "messages", "content", key="id", batched=True)
MESSAGES_BATCH = 128
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

# What SQLite spells its own way (the rest is ``storage.session_sql``'s): the JSON edit of
# a superseded message, one row at a time.
SQL_SUPERSEDE = (
    "UPDATE messages SET display_metadata ="
    " json_set(COALESCE(display_metadata, '{}'), '$.superseded', ?)"
    " WHERE session_id = ? AND id = ? AND display_kind IS NULL"
)


@functools.lru_cache(maxsize=16)
def sql_insert_messages(n: int) -> str:
    """One INSERT for a whole turn of ``n`` messages (turns are short: few shapes)."""
    return insert_messages_sql(n, "?")


# A new conversation's session in one statement (``SqliteRows.insert_new_session``).
SQL_INSERT_NEW_SESSION = insert_new_session_sql("?")
