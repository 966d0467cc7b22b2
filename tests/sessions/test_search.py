"""Full-text search over messages, on every backend: every word must start a word of the
message, newest first, a snippet with the matched words marked; deleted sessions and
pruned rows are gone from it; text without words finds nothing; query syntax is text.
Also the web UI's other message-level store operation: superseding (edit, regenerate)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from delivery.session_backend import SNIPPET_END, SNIPPET_START, search_terms
from gateway.session import SessionStore
from storage.sqlite.sessions_sql import MESSAGES_BATCH, MESSAGES_INDEX
from tests.fts_support import index_intact, indexed
from tests.sessions._support import append_turn, make_session, run_sync
from tests.stores import session_file_store


def _marked(snippet: str) -> list[str]:
    return [part.split(SNIPPET_END)[0] for part in snippet.split(SNIPPET_START)[1:]]


def test_search_finds_every_word_newest_first(store: SessionStore) -> None:
    make_session(store, "s1", title="one")
    make_session(store, "s2", title="two")
    append_turn(
        store,
        "s1",
        [
            {"role": "user", "content": "Deploy the staging cluster tonight"},
            {"role": "assistant", "content": "The staging cluster is deployed."},
        ],
    )
    store.append_message("s2", "user", "Production cluster: deploying later")
    hits = store.search_messages("deploy cluster")
    assert [(h.session_id, h.role) for h in hits] == [
        ("s2", "user"),
        ("s1", "assistant"),
        ("s1", "user"),
    ]
    assert hits[0].message_id > hits[1].message_id > hits[2].message_id
    assert {w.lower() for w in _marked(hits[2].snippet)} >= {"deploy", "cluster"}
    assert [h.session_id for h in store.search_messages("STAGING")] == ["s1", "s1"]
    assert store.search_messages("staging production") == []
    assert store.search_messages("taging") == []  # a term starts a word
    assert len(store.search_messages("cluster", limit=1)) == 1


def test_search_text_is_never_query_syntax(store: SessionStore) -> None:
    make_session(store, "s", title="t")
    store.append_message("s", "user", 'he said "quote" AND NOT (this) OR * near:me')
    for text in ['"quote', "NOT", "(this)", "near:me", "AND OR", "*", "' OR 1=1 --", "\\"]:
        found = store.search_messages(text)
        assert len(found) == (0 if text in ("*", "\\", "' OR 1=1 --") else 1), text
    assert store.search_messages("   ") == []
    assert search_terms("a_b-c  A") == ("a", "b", "c")


def test_deleted_sessions_are_not_found(store: SessionStore) -> None:
    make_session(store, "gone", title="t")
    store.append_message("gone", "user", "secret plans")
    make_session(store, "kept", title="t")
    store.append_message("kept", "user", "public plans")
    assert len(store.search_messages("plans")) == 2
    store.delete_session("gone")
    assert [h.session_id for h in store.search_messages("plans")] == ["kept"]


def test_existing_rows_are_indexed_when_an_older_file_is_opened(tmp_path: Path) -> None:
    """A v5 file (no search index, no system prompts) gains an index holding the messages
    it already has, and the column."""
    path = tmp_path / "sessions.db"
    with session_file_store(path) as store:
        make_session(store, "old", title="t")
        store.append_message("old", "user", "written before search existed")
    conn = sqlite3.connect(path)
    conn.executescript(
        "DROP TRIGGER messages_fts_insert; DROP TRIGGER messages_fts_delete;"
        " DROP TRIGGER messages_fts_update; DROP TABLE messages_fts; PRAGMA user_version = 5;"
        " ALTER TABLE sessions DROP COLUMN system_prompt;"
    )
    conn.execute(
        "INSERT INTO messages (session_id, role, content, created_at)"
        " VALUES ('old', 'user', 'also unindexed', 1.0)"
    )
    conn.commit()
    conn.close()
    with session_file_store(path) as store:
        assert [h.role for h in store.search_messages("before search")] == ["user"]
        assert len(store.search_messages("unindexed")) == 1
        store.append_message("old", "assistant", "after the upgrade")
        assert len(store.search_messages("upgrade")) == 1
        assert run_sync(store.aset_system_prompt("old", "Be kind."))
        record = store.get_session("old")
        assert record is not None and record.system_prompt == "Be kind."


def test_superseded_messages_stay_but_leave_the_model_context(store: SessionStore) -> None:
    from gateway.turns.conversation import build_context

    make_session(store, "s", title="t")
    rows = append_turn(
        store, "s", [{"role": "user", "content": "first"}, {"role": "assistant", "content": "one"}]
    )
    store.append_message(
        "s", "system", "a result", display_kind="async_delegation_complete", dedupe_key="d:1"
    )
    delivery = store.messages("s")[-1]
    marked = run_sync(store.asupersede("s", [r.id for r in rows] + [delivery.id], "edited"))
    assert marked == 2  # a delivery row is never superseded
    after = store.messages("s")
    assert [(m.content, (m.display_metadata or {}).get("superseded")) for m in after] == [
        ("first", "edited"),
        ("one", "edited"),
        ("a result", None),
    ]
    history = [m.as_dict() for m in after if not m.is_delivery]
    user = {"role": "user", "content": "second"}
    context = build_context(history, [], [user], user)
    assert [m["content"] for m in context] == ["second"]


def test_postgres_migration_indexes_the_messages_already_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A database at version 8 (before search) gains an index that holds its messages."""
    import psycopg

    from storage.postgres import migrations
    from tests.pg_support import fresh_url
    from tests.stores import pg_sessions

    url = fresh_url()
    before = tuple(m for m in migrations.MIGRATIONS if m.version <= 8)
    with monkeypatch.context() as patch:
        patch.setattr(migrations, "MIGRATIONS", before)
        patch.setattr(migrations, "SCHEMA_VERSION", 8)
        with psycopg.connect(url, autocommit=True) as conn:
            migrations.migrate(conn)
            conn.execute(
                "INSERT INTO sessions (id, source, session_key, title, created_at, updated_at)"
                " VALUES ('old', NULL, NULL, 't', 1, 1)"
            )
            conn.execute(
                "INSERT INTO messages (session_id, role, content, created_at)"
                " VALUES ('old', 'user', 'written before search existed', 1)"
            )
    backend = pg_sessions(url)  # migrates to the newest version
    try:
        store = SessionStore(backend)
        assert [h.session_id for h in store.search_messages("before search")] == ["old"]
        record = store.get_session("old")
        assert record is not None and record.system_prompt is None
    finally:
        backend.close()


def test_sqlite_indexes_messages_in_batches_and_a_search_never_misses_one(
    tmp_path: Path,
) -> None:
    """A turn's own commit leaves the text index alone; a search first indexes what was
    written since the last batch; a full batch is indexed by the writer without a search;
    a store closed in order leaves nothing unindexed."""
    path = tmp_path / "sessions.db"
    with session_file_store(path) as store:
        make_session(store, "s", title="t")
        append_turn(store, "s", [{"role": "user", "content": "nightly backup"}])
        assert indexed(path, MESSAGES_INDEX)[1] == 1  # committed, not indexed yet
        assert [h.session_id for h in store.search_messages("backup")] == ["s"]
        assert indexed(path, MESSAGES_INDEX)[1] == 0
        for i in range(0, MESSAGES_BATCH, 2):
            append_turn(
                store,
                "s",
                [
                    {"role": "user", "content": f"question {i:04d}"},
                    {"role": "assistant", "content": f"answer {i + 1:04d}"},
                ],
            )
        append_turn(store, "s", [{"role": "user", "content": "after the batch"}])
        # The batch's indexing was queued behind the turns: flush the writer's queue.
        store.append_message("s", "user", "flush")
        upto, tail = indexed(path, MESSAGES_INDEX)
        assert upto > MESSAGES_BATCH and tail < MESSAGES_BATCH  # a full batch was indexed
        assert [h.role for h in store.search_messages("answer 0007")] == ["assistant"]
        assert len(store.search_messages("after batch")) == 1
        store.append_message("s", "user", "the last word")
    assert indexed(path, MESSAGES_INDEX)[1] == 0  # closed in order: everything indexed
    index_intact(path, MESSAGES_INDEX)


def test_messages_a_crash_left_unindexed_are_found_and_follow_deletes(tmp_path: Path) -> None:
    """Messages written after the last batch by a server that died (the tail, as it left the
    file) are indexed by the next search; a tail message deleted or edited before that is
    indexed as it is then, and a deleted session's messages are gone from the index."""
    path = tmp_path / "sessions.db"
    with session_file_store(path) as store:
        make_session(store, "kept", title="t")
        make_session(store, "gone", title="t")
        store.append_message("gone", "user", "indexed plans")
        assert len(store.search_messages("plans")) == 1  # indexed: below the mark
    raw = sqlite3.connect(path, isolation_level=None)
    raw.executescript(
        "INSERT INTO messages (session_id, role, content, created_at) VALUES"
        " ('kept', 'user', 'crash survivor plans', 1.0),"
        " ('gone', 'user', 'unindexed plans', 1.0),"
        " ('kept', 'user', 'draft text', 1.0);"
        "UPDATE messages SET content = 'edited plans' WHERE content = 'draft text';"
    )
    raw.close()
    assert indexed(path, MESSAGES_INDEX)[1] == 3
    with session_file_store(path) as store:
        store.delete_session("gone")  # one message indexed, one in the tail
        hits = store.search_messages("plans")
        assert sorted(h.session_id for h in hits) == ["kept", "kept"]
        assert store.search_messages("draft") == []
    index_intact(path, MESSAGES_INDEX)


def test_a_file_with_per_insert_triggers_gets_the_batched_ones(tmp_path: Path) -> None:
    """A file whose index took each message in its insert's transaction (no mark) keeps its
    index, and gains the guarded triggers and a mark at its last message, once, on open."""
    path = tmp_path / "sessions.db"
    with session_file_store(path) as store:
        make_session(store, "s", title="t")
        store.append_message("s", "user", "older words")
        store.search_messages("older")
    raw = sqlite3.connect(path, isolation_level=None)
    raw.executescript(
        "DROP TRIGGER messages_fts_insert; DROP TRIGGER messages_fts_delete;"
        " DROP TRIGGER messages_fts_update; DROP TABLE messages_fts_mark;"
        "CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN"
        " INSERT INTO messages_fts (rowid, content) VALUES (new.id, new.content); END;"
        "CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN"
        " INSERT INTO messages_fts (messages_fts, rowid, content)"
        " VALUES ('delete', old.id, old.content); END;"
        "INSERT INTO messages (session_id, role, content, created_at)"
        " VALUES ('s', 'user', 'indexed by its insert', 1.0);"
    )
    raw.close()
    with session_file_store(path) as store:
        assert indexed(path, MESSAGES_INDEX)[1] == 0  # the mark sits at the last message
        store.append_message("s", "assistant", "written after the upgrade")
        assert indexed(path, MESSAGES_INDEX)[1] == 1
        assert len(store.search_messages("older")) == 1
        assert len(store.search_messages("by its insert")) == 1
        assert len(store.search_messages("after upgrade")) == 1
    raw = sqlite3.connect(path)
    triggers = [r[0] for r in raw.execute("SELECT sql FROM sqlite_master WHERE type='trigger'")]
    raw.close()
    assert len(triggers) == 3 and all("messages_fts_mark" in sql for sql in triggers)
    index_intact(path, MESSAGES_INDEX)
