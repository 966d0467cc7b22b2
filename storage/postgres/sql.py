"""The SQL of the PostgreSQL backends (ledger and session store), named.

Kept apart from the backends so the statements read as one list. Names are unqualified:
every table lives in the connection's ``search_path`` schema (``public`` by default; the
tests give each store a schema of its own). The schema itself is built by the versioned
migrations in ``storage.postgres.migrations``.
"""

from __future__ import annotations

from collections.abc import Sequence

from delivery.backend import COLUMNS
from storage.sql import WAITING_HELD_BY, marked

# -- the ledger ------------------------------------------------------------------------------

LEDGER_SELECT = f"SELECT {', '.join(COLUMNS)} FROM deliveries"
LEDGER_GET = f"{LEDGER_SELECT} WHERE id = %s"
LEDGER_PENDING_WITH_EVENT = (
    f"{LEDGER_SELECT} WHERE delivery_state = 'pending' AND completed_at IS NOT NULL"
    " AND event IS NOT NULL ORDER BY completed_at, id LIMIT %s"
)
LEDGER_DUE = (
    f"{LEDGER_SELECT} WHERE delivery_state = 'pending' AND due_at <= %s ORDER BY due_at LIMIT %s"
)
# The same rows, read by the first statement of the transaction that offers them and locked
# for it (``PostgresBackend.write_due``): rows another transaction is offering or settling
# right now are skipped, not waited for, and the rows read are the rows locked, so the
# offer's compare-and-sets need no second look. LockRows sits under the LIMIT: a skipped row
# does not take a place in the batch. It runs with bitmap scans off: the rows of a burst
# were written moments before, past the statistics' last due time, so the planner expects a
# few dozen due rows and reads every due row through a bitmap, sorts them all, and locks
# the first ``limit``. Ten thousand timers due at once cost 15 ms a batch that way, each
# batch also rereading the index entries of the rows the batches before it moved; an index
# scan in due order stops after ``limit`` rows (1 ms) and marks the moved rows' entries dead
# as it passes them.
LEDGER_DUE_LOCKED = f"{LEDGER_DUE} FOR UPDATE SKIP LOCKED"
# The first entry of the due index, not min(): every scheduler pass ends with this read,
# prepared once per pooled connection, and a min() prepared while the ledger was empty keeps
# the plan it got then (read every pending row through another partial index, and take the
# least: 33 ms at 100,000 pending, pass after pass while timers are written). Asked in the
# index's order, the planner has one index that gives it, whatever the statistics say.
LEDGER_NEXT_DUE = (
    "SELECT due_at FROM deliveries WHERE delivery_state = 'pending' AND due_at IS NOT NULL"
    " ORDER BY due_at LIMIT 1"
)
# The distinct holders by hopping from one to the next through ix_pending_holder (a loose
# index scan, one probe per holder), not a DISTINCT over every pending row: every re-offer
# batch asks, and with 100,000 timers pending that read 100,000 index entries each time.
LEDGER_PENDING_HOLDERS = """
WITH RECURSIVE h(holder) AS (
    (SELECT holder FROM deliveries
     WHERE delivery_state = 'pending' AND holder IS NOT NULL ORDER BY holder LIMIT 1)
    UNION ALL
    SELECT (SELECT d.holder FROM deliveries d
            WHERE d.delivery_state = 'pending' AND d.holder > h.holder
            ORDER BY d.holder LIMIT 1)
    FROM h WHERE h.holder IS NOT NULL
)
SELECT holder FROM h WHERE holder IS NOT NULL
"""
LEDGER_ACTIVE_OWNERS = (
    "SELECT DISTINCT owner FROM deliveries WHERE state = %s AND owner IS NOT NULL"
)
LEDGER_HELD_BY = f"{LEDGER_SELECT} WHERE delivery_state = 'pending' AND holder = %s LIMIT %s"
# A dead holder's waiting rows taken over (``LedgerTx.adopt_waiting``): those another
# transaction has locked (a survivor beside this one taking them too) are skipped, not
# waited for.
LEDGER_ADOPT_WAITING = marked(
    f"WITH w AS (SELECT id FROM deliveries WHERE {WAITING_HELD_BY} LIMIT ?"
    " FOR UPDATE SKIP LOCKED)"
    " UPDATE deliveries AS d SET holder = ?, updated_at = ? FROM w WHERE d.id = w.id",
    "%s",
)
LEDGER_OWNED_BY = f"{LEDGER_SELECT} WHERE state = %s AND owner = %s LIMIT %s"
LEDGER_DELIVERY_COUNTS = (
    "SELECT COUNT(*), COUNT(claim_token) FROM deliveries WHERE delivery_state = 'pending'"
)
LEDGER_AUDIT = "SELECT at, action, detail FROM delivery_audit WHERE delivery_id = %s ORDER BY seq"
LEDGER_INSERT_AUDIT = (
    "INSERT INTO delivery_audit (delivery_id, at, action, detail) VALUES (%s, %s, %s, %s)"
)
# Rows a re-offer scan picks: rows another process is offering right now are skipped, not
# waited for (their compare-and-set would fail anyway once that process commits).
LEDGER_LOCK_SKIP_LOCKED = (
    "SELECT id FROM deliveries WHERE id = ANY(%s) ORDER BY id FOR UPDATE SKIP LOCKED"
)
SERVERS_SELECT = (
    "SELECT identity, label, started_at, heartbeat_at FROM servers ORDER BY started_at, identity"
)
SERVERS_PUT = (
    "INSERT INTO servers (identity, label, started_at, heartbeat_at) VALUES (%s, %s, %s, %s)"
    " ON CONFLICT (identity) DO UPDATE SET label = excluded.label,"
    " heartbeat_at = excluded.heartbeat_at"
)
SERVERS_DELETE = "DELETE FROM servers WHERE identity = %s"
# The words of a goal as the ledger's text index holds them (migration 13; the planner uses
# that index only for this very expression). ASCII punctuation becomes spaces first, so a
# path, an address or a dotted name is split into its words as SQLite's FTS5 and the memory
# backend split it ("/var/backup/db" holds "backup"); the parser alone keeps it one token.
GOAL_WORDS = (
    r"to_tsvector('simple', regexp_replace(coalesce(goal, ''),"
    r" '[\x01-\x2f\x3a-\x40\x5b-\x60\x7b-\x7f]+', ' ', 'g'))"
)
LEDGER_GOAL_MATCH = f"{GOAL_WORDS} @@ to_tsquery('simple', %s)"

# -- the session store --------------------------------------------------------------------------
# Only what PostgreSQL spells its own way: the statements both SQL dialects share are
# ``storage.session_sql``'s.

# Every write of one session (or one idempotency key, one turn lease) first takes this
# transaction lock, so a delete, a creation and a fold of the same id never interleave,
# across processes too.
SQL_LOCK_KEY = "SELECT pg_advisory_xact_lock(hashtext(%s))"
# Several such locks in one statement, always in the order of their hashes (PostgreSQL
# calls a volatile function of the select list after the sort): two transactions that
# each take several can never wait on each other in a cycle (``session_batches``).
SQL_LOCK_KEYS = (
    "SELECT pg_advisory_xact_lock(h)"
    " FROM (SELECT DISTINCT hashtext(k) AS h FROM unnest(%s::text[]) AS k) AS keys ORDER BY h"
)

# Full-text search (migration 9): the newest matches first, a snippet of each with the
# matched words between \x02 and \x03 (``delivery.session_backend.SNIPPET_START``/_END),
# made only for the rows returned.
SQL_SEARCH = (
    "SELECT h.session_id, h.id, h.role, h.created_at,"
    " ts_headline('simple', h.content, to_tsquery('simple', %(q)s),"
    " 'StartSel=' || chr(2) || ', StopSel=' || chr(3) || ', MaxWords=18, MinWords=6,"
    " MaxFragments=1, FragmentDelimiter=…')"
    " FROM (SELECT session_id, id, role, created_at, content FROM messages"
    " WHERE content_tsv @@ to_tsquery('simple', %(q)s) ORDER BY id DESC LIMIT %(limit)s) h"
    " ORDER BY h.id DESC"
)


def tsquery(terms: Sequence[str]) -> str:
    """A ``to_tsquery`` text in which every term must start a word (terms are letters and
    digits only, ``search_terms``: none is an operator)."""
    return " & ".join(f"{term}:*" for term in terms)


SQL_SUPERSEDE = (
    "UPDATE messages SET display_metadata = (COALESCE(display_metadata, '{}')::jsonb"
    " || jsonb_build_object('superseded', %s::text))::text"
    " WHERE session_id = %s AND id = ANY(%s) AND display_kind IS NULL"
)
SQL_UNFOLDED_BY_DEDUPE = (
    "SELECT session_id, dedupe_key FROM messages"
    " WHERE (session_id, dedupe_key) IN (SELECT * FROM unnest(%s::text[], %s::text[]))"
    " AND display_kind IS NOT NULL AND folded_at IS NULL"
)
