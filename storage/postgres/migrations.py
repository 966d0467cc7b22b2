"""Versioned schema migrations of the PostgreSQL store, applied at start under an advisory lock.

``MIGRATIONS`` is the ordered list of (version, description, SQL). ``migrate(conn)`` takes
``pg_advisory_lock`` on a key derived from the schema the connection writes to, so several
processes starting at once apply each migration once: the first applies, the others wait
and then find nothing to do. A database whose recorded version is newer than the newest one
this code knows is refused (``SchemaTooNew``) without being touched: an older build must not
write into a schema it does not understand.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import psycopg

from delivery.errors import LedgerError
from storage.postgres.conn import PostgresUnavailable, connect, explain
from storage.postgres.sql import GOAL_WORDS
from storage.responses_sql import DDL as RESPONSES_DDL
from storage.schedules_sql import SCHEDULES_DDL

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "SchemaTooNew", "migrate", "status"]


class SchemaTooNew(LedgerError):
    """The database was migrated by a newer Reveille than this one."""


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    description: str
    sql: str


# Migration 22. A timer firing updates its row three times within a second (offered, claimed,
# acknowledged). An update that changes no indexed column can stay on the row's page without
# an entry in any index (a HOT update), but only when the page has room for the new version:
# rows are written 70% full, so a claim (which leaves every indexed column as the offer wrote
# it, ``delivery.claims``) costs a tuple instead of an entry in each of twelve indexes.
# Pages written before keep their fill until rewritten. And as SQLite's ledger already does
# (``storage.sqlite.ledger._NARROWED``): six indexes leave out the rows whose column is NULL
# (each query compares the column, or asks for it NOT NULL, which the planner proves the
# predicate from), so an update of a row without a hook or an origin session writes none of
# their entries. A database made before gets them rebuilt once, here.
_NARROWED = (
    ("ix_pending_due", "due_at", "delivery_state = 'pending' AND "),
    ("ix_pending_holder", "holder", "delivery_state = 'pending' AND "),
    ("ix_deliveries_pending_hook", "hook", "delivery_state = 'pending' AND "),
    ("ix_session_key", "session_key", ""),
    ("ix_origin_session", "origin_session_id", ""),
    ("ix_origin_ui_session", "origin_ui_session_id", ""),
)
_LEDGER_HOT_ROOM = "ALTER TABLE deliveries SET (fillfactor = 70);" + "".join(
    f" DROP INDEX IF EXISTS {name};"
    f" CREATE INDEX {name} ON deliveries ({column}) WHERE {pending}{column} IS NOT NULL;"
    for name, column, pending in _NARROWED
)

MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "ledger: deliveries, audit, servers",
        """
CREATE TABLE deliveries (
    seq BIGSERIAL NOT NULL UNIQUE,
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    state TEXT NOT NULL,
    delivery_state TEXT NOT NULL,
    session_key TEXT,
    origin_session_id TEXT,
    origin_ui_session_id TEXT,
    goal TEXT,
    request TEXT,
    event TEXT,
    owner TEXT,
    holder TEXT,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    started_at DOUBLE PRECISION,
    completed_at DOUBLE PRECISION,
    claim_token TEXT,
    claim_consumer TEXT,
    claimed_at DOUBLE PRECISION,
    claim_expires_at DOUBLE PRECISION NOT NULL DEFAULT 0,
    delivery_attempts INTEGER NOT NULL DEFAULT 0,
    refunds INTEGER NOT NULL DEFAULT 0,
    next_attempt_at DOUBLE PRECISION NOT NULL DEFAULT 0,
    due_at DOUBLE PRECISION,
    settled_at DOUBLE PRECISION,
    settled_reason TEXT,
    replay_from DOUBLE PRECISION,
    restored INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX ix_pending_due ON deliveries (due_at) WHERE delivery_state = 'pending';
CREATE INDEX ix_pending_completed ON deliveries (completed_at) WHERE delivery_state = 'pending';
CREATE INDEX ix_pending_holder ON deliveries (holder) WHERE delivery_state = 'pending';
CREATE INDEX ix_state_owner ON deliveries (state, owner);
CREATE INDEX ix_session_key ON deliveries (session_key);
CREATE INDEX ix_origin_session ON deliveries (origin_session_id);
CREATE INDEX ix_origin_ui_session ON deliveries (origin_ui_session_id);
CREATE TABLE delivery_audit (
    seq BIGSERIAL PRIMARY KEY,
    delivery_id TEXT NOT NULL,
    at DOUBLE PRECISION NOT NULL,
    action TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX ix_audit_delivery ON delivery_audit (delivery_id, seq);
CREATE TABLE servers (
    identity TEXT PRIMARY KEY,
    label TEXT NOT NULL,
    started_at DOUBLE PRECISION NOT NULL,
    heartbeat_at DOUBLE PRECISION NOT NULL
);
""",
    ),
    Migration(
        2,
        "sessions: sessions, messages, idempotency, tombstones",
        """
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    source TEXT,
    session_key TEXT,
    title TEXT,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);
-- a sequence never hands out an id twice: clients page transcripts with after_id
CREATE TABLE messages (
    id BIGSERIAL PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    display_kind TEXT,
    display_metadata TEXT,
    dedupe_key TEXT,
    folded_at DOUBLE PRECISION,
    UNIQUE (session_id, dedupe_key)
);
CREATE INDEX idx_messages_session ON messages (session_id, id);
CREATE INDEX idx_messages_unfolded ON messages (session_id)
    WHERE display_kind IS NOT NULL AND folded_at IS NULL;
CREATE INDEX idx_sessions_updated ON sessions (updated_at);
CREATE INDEX idx_sessions_key ON sessions (session_key);
CREATE TABLE idempotency (
    key TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    owner TEXT,
    session_id TEXT,
    response TEXT,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);
CREATE TABLE tombstones (
    id TEXT PRIMARY KEY,
    deleted_at DOUBLE PRECISION NOT NULL
);
""",
    ),
    Migration(
        3,
        "sessions: running turns (leases) and their approvals",
        """
CREATE TABLE running_turns (
    session_id TEXT PRIMARY KEY,
    stream_id TEXT NOT NULL,
    owner TEXT NOT NULL,
    wakeup INTEGER NOT NULL,
    started_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL
);
CREATE TABLE approvals (
    id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    stream_id TEXT NOT NULL,
    command TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX idx_approvals_session ON approvals (session_id, stream_id);
""",
    ),
    Migration(
        4,
        "web UI: event log, unread marks, tool steps, settings",
        """
CREATE TABLE webui_events (
    id BIGSERIAL PRIMARY KEY,
    created_at DOUBLE PRECISION NOT NULL,
    type TEXT NOT NULL,
    data TEXT NOT NULL
);
CREATE TABLE webui_unread (
    session_id TEXT PRIMARY KEY,
    unread BOOLEAN NOT NULL
);
CREATE TABLE webui_tool_steps (
    id BIGSERIAL PRIMARY KEY,
    session_id TEXT NOT NULL,
    turn_id TEXT NOT NULL,
    message_id BIGINT,
    created_at DOUBLE PRECISION NOT NULL,
    name TEXT NOT NULL,
    status TEXT NOT NULL,
    summary TEXT NOT NULL
);
CREATE INDEX idx_webui_tool_steps_session ON webui_tool_steps (session_id, id);
CREATE INDEX idx_webui_tool_steps_turn ON webui_tool_steps (turn_id);
CREATE TABLE webui_meta (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
""",
    ),
    Migration(
        5,
        "sessions: compaction (seen delivery rows, archived rows and their summary)",
        """
ALTER TABLE messages ADD COLUMN IF NOT EXISTS seen_at DOUBLE PRECISION;
ALTER TABLE messages ADD COLUMN IF NOT EXISTS archived_at DOUBLE PRECISION;
ALTER TABLE messages ADD COLUMN IF NOT EXISTS summary_id BIGINT;
CREATE INDEX IF NOT EXISTS idx_messages_live ON messages (session_id, id)
    WHERE archived_at IS NULL;
""",
    ),
    Migration(
        6,
        "responses API: responses and their stream events",
        # The one text of these tables (SQLite's responses.db uses it too); a later change to
        # them is a migration of its own.
        RESPONSES_DDL,
    ),
    Migration(
        7,
        "webhooks: deliveries (one per event and endpoint), attempts, signing secrets",
        """
CREATE TABLE webhook_deliveries (
    id TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    event_type TEXT NOT NULL,
    object_id TEXT NOT NULL,
    body TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at DOUBLE PRECISION NOT NULL DEFAULT 0,
    claim_token TEXT,
    claim_expires_at DOUBLE PRECISION NOT NULL DEFAULT 0,
    settled_at DOUBLE PRECISION,
    settled_reason TEXT,
    PRIMARY KEY (id, endpoint)
);
CREATE INDEX ix_webhook_pending ON webhook_deliveries (next_attempt_at)
    WHERE state = 'pending';
CREATE INDEX ix_webhook_created ON webhook_deliveries (created_at);
CREATE TABLE webhook_attempts (
    seq BIGSERIAL PRIMARY KEY,
    delivery_id TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    at DOUBLE PRECISION NOT NULL,
    consumer TEXT NOT NULL,
    outcome TEXT NOT NULL,
    status INTEGER,
    error TEXT
);
CREATE INDEX ix_webhook_attempts ON webhook_attempts (delivery_id, seq);
CREATE TABLE webhook_secrets (
    secret TEXT PRIMARY KEY,
    created_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION
);
""",
    ),
    Migration(
        8,
        "retention: settled rows by age, tombstones of pruned rows, leases, age indexes",
        """
CREATE INDEX IF NOT EXISTS ix_settled ON deliveries (settled_at, id)
    WHERE delivery_state IN ('delivered', 'dropped');
CREATE TABLE IF NOT EXISTS delivery_tombstones (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    state TEXT NOT NULL,
    delivery_state TEXT NOT NULL,
    session_key TEXT,
    completed_at DOUBLE PRECISION,
    settled_at DOUBLE PRECISION,
    pruned_at DOUBLE PRECISION NOT NULL,
    reason TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS ix_tombstones_pruned ON delivery_tombstones (pruned_at);
CREATE TABLE IF NOT EXISTS leases (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS idx_idempotency_done ON idempotency (updated_at) WHERE state = 'done';
CREATE INDEX IF NOT EXISTS idx_tombstones_deleted ON tombstones (deleted_at);
""",
    ),
    Migration(
        9,
        "approvals asked by background units: the unit, its process, its deadline",
        """
ALTER TABLE approvals ADD COLUMN IF NOT EXISTS unit_id TEXT NOT NULL DEFAULT '';
ALTER TABLE approvals ADD COLUMN IF NOT EXISTS owner TEXT NOT NULL DEFAULT '';
ALTER TABLE approvals ADD COLUMN IF NOT EXISTS expires_at DOUBLE PRECISION NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS idx_approvals_unit_pending ON approvals (created_at)
    WHERE status = 'pending' AND unit_id <> '';
""",
    ),
    Migration(
        10,
        "web UI: full-text search over messages (a generated tsvector, its GIN index);"
        " a chat's own system prompt",
        # A stored generated column: the rows already there are indexed by this ALTER (the
        # backfill), every later insert and edit by PostgreSQL itself, in its own statement.
        """
ALTER TABLE messages ADD COLUMN IF NOT EXISTS content_tsv tsvector
    GENERATED ALWAYS AS (to_tsvector('simple', content)) STORED;
CREATE INDEX IF NOT EXISTS idx_messages_search ON messages USING GIN (content_tsv);
ALTER TABLE sessions ADD COLUMN IF NOT EXISTS system_prompt TEXT;
""",
    ),
    Migration(
        11,
        "responses API: who asked for each response (queued responses are capped per key)",
        "ALTER TABLE responses ADD COLUMN IF NOT EXISTS caller TEXT",
    ),
    Migration(
        12,
        "ledger: what a running unit last reported (progress)",
        "ALTER TABLE deliveries ADD COLUMN IF NOT EXISTS progress TEXT;",
    ),
    Migration(
        13,
        "telegram: the adapter's state in the store (inbox with claims, offset, replies,"
        " chat sessions); its polling lease is a row of leases",
        """
CREATE TABLE IF NOT EXISTS telegram_offsets (
    bot TEXT PRIMARY KEY,
    next_offset BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS telegram_inbox (
    bot TEXT NOT NULL,
    update_id BIGINT NOT NULL,
    payload TEXT NOT NULL,
    received_at DOUBLE PRECISION NOT NULL,
    answered_at DOUBLE PRECISION,
    holder TEXT,
    claimed_until DOUBLE PRECISION NOT NULL DEFAULT 0,
    PRIMARY KEY (bot, update_id)
);
CREATE INDEX IF NOT EXISTS ix_telegram_inbox_open ON telegram_inbox (bot, update_id)
    WHERE answered_at IS NULL;
CREATE TABLE IF NOT EXISTS telegram_reply_parts (
    reply_key TEXT NOT NULL,
    part INTEGER NOT NULL,
    chat_id TEXT NOT NULL,
    message_id BIGINT NOT NULL,
    PRIMARY KEY (reply_key, part)
);
CREATE TABLE IF NOT EXISTS telegram_replies_done (
    reply_key TEXT PRIMARY KEY,
    done_at DOUBLE PRECISION NOT NULL
);
CREATE TABLE IF NOT EXISTS telegram_chat_sessions (
    chat_key TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    started_at DOUBLE PRECISION NOT NULL
);
""",
    ),
    Migration(
        14,
        "ledger: a GIN index over the words of each goal (the deliveries page's search)",
        # An expression index: the rows already there are indexed by this statement, later
        # writes by PostgreSQL itself; ``storage.postgres.sql.GOAL_WORDS`` is the expression
        # every search repeats, so it must not change without a migration of its own.
        "CREATE INDEX IF NOT EXISTS ix_deliveries_goal_words ON deliveries"
        f" USING GIN ({GOAL_WORDS});",
    ),
    Migration(
        15,
        "ledger: a completion due later (not_before: a timer's firing instant)",
        # ``due_at`` carries it for the re-offer scheduler, so the pending ``due_at`` index
        # already answers "next due"; this column only says when, for people and replays.
        "ALTER TABLE deliveries ADD COLUMN IF NOT EXISTS not_before DOUBLE PRECISION;",
    ),
    Migration(
        16,
        "inbound events: POST /v1/hooks/{name}, deduplicated by (hook, webhook-id), and each"
        " hook's verification secrets",
        """
        CREATE TABLE IF NOT EXISTS hook_events (
            hook TEXT NOT NULL,
            webhook_id TEXT NOT NULL,
            received_at DOUBLE PRECISION NOT NULL,
            body TEXT NOT NULL,
            PRIMARY KEY (hook, webhook_id)
        );
        CREATE INDEX IF NOT EXISTS ix_hook_events_received ON hook_events(hook, received_at);
        CREATE TABLE IF NOT EXISTS hook_secrets (
            hook TEXT NOT NULL,
            secret TEXT NOT NULL,
            created_at DOUBLE PRECISION NOT NULL,
            expires_at DOUBLE PRECISION,
            PRIMARY KEY (hook, secret)
        );
        """,
    ),
    Migration(
        17, "schedules: recurring wake-ups (their occurrences are ledger rows)", SCHEDULES_DDL
    ),
    Migration(
        18,
        "chat platforms: a platform's own small values (Matrix's /sync token and device)",
        "CREATE TABLE IF NOT EXISTS chat_platform_values ("
        " name TEXT PRIMARY KEY, value TEXT NOT NULL, written_at DOUBLE PRECISION);",
    ),
    Migration(
        19,
        "API conversations: a session's metadata (/v1/conversations)",
        "ALTER TABLE sessions ADD COLUMN IF NOT EXISTS metadata TEXT;",
    ),
    Migration(
        20,
        "approvals: an MCP server's form and the values it was approved with",
        "ALTER TABLE approvals ADD COLUMN IF NOT EXISTS form TEXT NOT NULL DEFAULT '';"
        " ALTER TABLE approvals ADD COLUMN IF NOT EXISTS answer TEXT NOT NULL DEFAULT '';",
    ),
    Migration(
        21,
        "ledger: the hook an open wake_when wait listens on, indexed over pending rows",
        # An arriving event reads only its hook's waits; the waits already open get theirs.
        "ALTER TABLE deliveries ADD COLUMN IF NOT EXISTS hook TEXT;"
        " UPDATE deliveries SET hook = event::jsonb ->> 'hook'"
        " WHERE kind = 'wake_when' AND delivery_state = 'pending' AND hook IS NULL;"
        " CREATE INDEX IF NOT EXISTS ix_deliveries_pending_hook ON deliveries (hook)"
        " WHERE delivery_state = 'pending';",
    ),
    Migration(
        22,
        "ledger: room on each page for a row's next version (fillfactor 70), and six indexes"
        " without the rows whose column is NULL",
        _LEDGER_HOT_ROOM,
    ),
)
SCHEMA_VERSION = MIGRATIONS[-1].version

_VERSIONS = """
CREATE TABLE IF NOT EXISTS reveille_schema (
    version INTEGER PRIMARY KEY,
    description TEXT NOT NULL,
    applied_at DOUBLE PRECISION NOT NULL
)
"""
# One lock per schema: stores in different schemas of one database migrate independently.
_LOCK = "SELECT pg_advisory_lock(hashtext('reveille.migrate.' || current_schema()))"
_UNLOCK = "SELECT pg_advisory_unlock(hashtext('reveille.migrate.' || current_schema()))"


def _current(conn: Any) -> int:
    found = conn.execute(
        "SELECT to_regclass(current_schema() || '.reveille_schema') IS NOT NULL"
    ).fetchone()
    if not found or not found[0]:
        return 0
    row = conn.execute("SELECT coalesce(max(version), 0) FROM reveille_schema").fetchone()
    return int(row[0]) if row else 0


def _too_new(version: int) -> SchemaTooNew:
    return SchemaTooNew(
        f"the database schema is at version {version}, newer than this Reveille knows "
        f"(version {SCHEMA_VERSION}); upgrade Reveille before pointing it at this database. "
        "Nothing was written."
    )


def status(conn: Any) -> dict[str, Any]:
    """``current``, ``latest`` and the ``pending`` migrations (version, description)."""
    current = _current(conn)
    return {
        "current": current,
        "latest": SCHEMA_VERSION,
        "pending": [(m.version, m.description) for m in MIGRATIONS if m.version > current],
        "too_new": current > SCHEMA_VERSION,
    }


def migrate(conn: Any, *, check_only: bool = False) -> list[int]:
    """Bring the schema up to date on ``conn`` (an autocommit connection); returns the
    versions applied here (empty when another process had applied them already).

    ``check_only`` refuses a schema that is too new or not yet migrated without writing.
    """
    if check_only:
        current = _current(conn)
        if current > SCHEMA_VERSION:
            raise _too_new(current)
        if current < SCHEMA_VERSION:
            raise LedgerError(
                f"the database schema is at version {current}, this Reveille needs "
                f"{SCHEMA_VERSION}: run `reveille db migrate`"
            )
        return []
    applied: list[int] = []
    conn.execute(_LOCK)
    try:
        current = _current(conn)
        if current > SCHEMA_VERSION:
            raise _too_new(current)
        for migration in MIGRATIONS:
            if migration.version <= current:
                continue
            with conn.transaction():
                conn.execute(_VERSIONS)
                conn.execute(migration.sql)
                conn.execute(
                    "INSERT INTO reveille_schema (version, description, applied_at)"
                    " VALUES (%s, %s, %s)",
                    (migration.version, migration.description, time.time()),
                )
            applied.append(migration.version)
    finally:
        conn.execute(_UNLOCK)
    return applied


def _schema_of(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("SELECT current_schema()").fetchone()
    if row is None or row[0] is None:
        raise PostgresUnavailable(
            "the PostgreSQL search_path names no schema this role can use; set one"
        )
    return str(row[0])


def prepare_database(url: str, *, check_only: bool = False) -> str:
    """Apply pending migrations (under the advisory lock), or with ``check_only`` refuse a
    schema that is too new or not migrated yet without writing; returns the store's schema."""
    conn = connect(url)
    try:
        migrate(conn, check_only=check_only)
        return _schema_of(conn)
    except psycopg.Error as exc:
        raise explain(exc, url) from None
    finally:
        conn.close()
