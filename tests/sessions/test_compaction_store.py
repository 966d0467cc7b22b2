"""The store's side of compaction, on every backend: ``acompact`` commits a summary and
archives the rows it replaces in one transaction, only under the caller's turn lease, never
a delivery row no stored turn saw (``append_turn(seen=...)``), never a row twice; archived
rows stay in every transcript read. Plus a v3 SQLite file upgrading to v4."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from gateway.session import SessionStore
from storage.sqlite.sessions_sql import SCHEMA_VERSION as SESSIONS_SCHEMA_VERSION
from tests.sessions._support import append_turn, begin, delivery, make_session, run_sync
from tests.stores import pg_sessions, session_file_store

SUMMARY = {"role": "system", "content": "[reveille:summary] s", "display_metadata": {"summary": {}}}


def _compact(store: SessionStore, stream: str, ids: list[int]) -> object:
    return run_sync(store.acompact("s", stream, ids, SUMMARY))


def test_compaction_needs_the_lease_and_a_seen_result(store: SessionStore) -> None:
    make_session(store, "s")
    u = store.append_message("s", "user", "hello")
    a = store.append_message("s", "assistant", "hi")
    d = delivery(store, "s", 1)
    # No lease: refused, nothing written.
    assert _compact(store, "st_1", [u.id, a.id]) is None
    assert store.take_turn("s", "st_1").stream_id == "st_1"
    # A lease, but another one's: refused.
    assert _compact(store, "st_other", [u.id, a.id]) is None
    # The delivery row is not folded, then folded but unseen: refused as a whole.
    assert _compact(store, "st_1", [u.id, d.id]) is None
    begin(store, "s")  # a turn folds it ...
    assert _compact(store, "st_1", [u.id, d.id]) is None
    # ... and a stored turn that was shown it marks it seen in its own commit.
    append_turn(
        store,
        "s",
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "r"}],
        seen=[d.id],
    )
    summary = _compact(store, "st_1", [u.id, a.id, d.id])
    assert summary is not None
    rows = store.messages("s")
    assert [r.id for r in rows][:3] == [u.id, a.id, d.id]  # archived, not deleted
    by_id = {r.id: r for r in rows}
    for rid in (u.id, a.id, d.id):
        assert by_id[rid].archived and by_id[rid].summary_id == summary.id  # type: ignore[attr-defined]
    assert by_id[d.id].seen
    # Never archived twice: a retry of the same compaction (after a crash) is refused.
    assert _compact(store, "st_1", [u.id]) is None
    assert sum(1 for r in store.messages("s") if r.role == "system" and r.display_kind is None) == 1
    # The same result delivered again (a re-offer after a crash): the archived row is the
    # answer, and no turn folds it a second time.
    again = delivery(store, "s", 1)
    assert again.id == d.id and again.archived
    assert begin(store, "s").taken == ()
    # Unknown ids refuse too.
    assert _compact(store, "st_1", [10**9]) is None


def test_a_v3_file_upgrades_to_the_current_version(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    with session_file_store(path) as store:
        make_session(store, "s")
        store.append_message("s", "user", "old")
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA foreign_keys = OFF")
    # What a v3 build wrote: messages without the compaction columns.
    conn.executescript(
        "BEGIN; CREATE TABLE m2 AS SELECT id, session_id, role, content, created_at,"
        " display_kind, display_metadata, dedupe_key, folded_at FROM messages;"
        " DROP TABLE messages; ALTER TABLE m2 RENAME TO messages; PRAGMA user_version = 3; COMMIT;"
    )
    conn.close()
    with session_file_store(path) as store:
        assert [m.content for m in store.messages("s")] == ["old"]
        assert not store.messages("s")[0].archived
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SESSIONS_SCHEMA_VERSION
    conn.close()


def test_a_v4_postgres_schema_migrates_to_v5() -> None:
    import psycopg

    from storage.postgres import migrations
    from tests.pg_support import fresh_url

    url = fresh_url()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE reveille_schema (version INTEGER PRIMARY KEY,"
            " description TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)"
        )
        for m in migrations.MIGRATIONS:
            if m.version <= 4:  # what a v4 build left
                conn.execute(m.sql)
                conn.execute(
                    "INSERT INTO reveille_schema VALUES (%s, %s, 0)", (m.version, m.description)
                )
        conn.execute("INSERT INTO sessions VALUES ('s', NULL, NULL, NULL, 0, 0)")
        conn.execute(
            "INSERT INTO messages (session_id, role, content, created_at)"
            " VALUES ('s', 'user', 'old', 0)"
        )
        # v5 is compaction's; later builds' migrations follow it.
        applied = migrations.migrate(conn)
        assert applied == [m.version for m in migrations.MIGRATIONS if m.version >= 5]
        assert applied[0] == 5
    store = SessionStore(pg_sessions(url, migrate=False))
    try:
        [row] = store.messages("s")
        assert (row.content, row.archived, row.seen, row.summary_id) == ("old", False, False, None)
    finally:
        store.close()
