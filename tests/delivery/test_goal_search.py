"""``RowQuery.text``: the words of a goal, found anywhere in the ledger through each backend's
text index (SQLite FTS5, PostgreSQL's GIN index, the memory backend's scan), alike on every
backend; what a person types is only ever words, never a syntax error.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from delivery.ledger import Ledger
from delivery.rows import RowQuery
from delivery.session_backend import holds_terms, search_terms
from storage.postgres import sql as pg_sql
from storage.sql import query_filter
from storage.sqlite.fts import TextIndex
from storage.sqlite.ledger import GOAL_SEARCH, GOALS_BATCH, GOALS_INDEX, SCHEMA_VERSION
from tests.delivery._support import FakeClock
from tests.fts_support import index_intact, indexed
from tests.stores import sqlite_ledger

EVENT = {"type": "async_delegation", "delegation_id": "x", "status": "completed"}

GOALS = {
    "deleg_old": "Nightly backup of /var/lib/db to s3://bucket.example.com",
    "deleg_mail": "mail the report to ops@example.com (quarterly-review)",
    "deleg_quote": 'summarise "NEAR" AND the -flag OR * stars',
    "deleg_under": "rotate_logs for host_7 version 3.14",
    "proc_none": None,
}


def _ids(ledger: Ledger, text: str, **filters: Any) -> list[str]:
    return [row.id for row in ledger.query(RowQuery(text=text, **filters))]


def _fill(ledger: Ledger, newer: int) -> None:
    for row_id, goal in GOALS.items():
        kind = "process" if row_id.startswith("proc_") else "delegation"
        ledger.create(row_id, kind=kind, goal=goal, session_key=f"agent:main:webui:{row_id}")
    futures = [
        ledger.submit_create(f"deleg_newer{i:04d}", kind="delegation", goal=f"job {i} checks")
        for i in range(newer)
    ]
    for future in futures:
        future.result()


def test_a_goal_word_finds_the_oldest_row_behind_many_newer(ledger: Ledger) -> None:
    _fill(ledger, 300)
    assert _ids(ledger, "backup") == ["deleg_old"]
    assert _ids(ledger, "back") == ["deleg_old"]  # each word is a prefix
    assert _ids(ledger, "NIGHTLY Backup") == ["deleg_old"]  # any case, any order
    assert _ids(ledger, "backup nightly") == ["deleg_old"]
    assert _ids(ledger, "backups") == []
    assert _ids(ledger, "nightly mail") == []  # every word must be in the same goal
    # Punctuation splits words alike on every backend: paths, addresses, dotted names.
    assert _ids(ledger, "lib") == ["deleg_old"]
    assert _ids(ledger, "bucket example") == ["deleg_old"]
    assert _ids(ledger, "ops example review") == ["deleg_mail"]
    assert _ids(ledger, "logs host 7") == ["deleg_under"]
    assert _ids(ledger, "3 14") == ["deleg_under"]


def test_text_combines_with_the_other_filters_the_limit_and_the_order(ledger: Ledger) -> None:
    _fill(ledger, 30)
    assert _ids(ledger, "job 1") == [
        f"deleg_newer{i:04d}" for i in (19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 1)
    ]
    assert _ids(ledger, "job", limit=3) == ["deleg_newer0029", "deleg_newer0028", "deleg_newer0027"]
    assert _ids(ledger, "job", limit=2, oldest_first=True) == ["deleg_newer0000", "deleg_newer0001"]
    assert _ids(ledger, "job 2", kind="process") == []
    assert _ids(ledger, "job 2", kind="delegation") == ["deleg_newer0029", "deleg_newer0028"] + [
        f"deleg_newer{i:04d}" for i in (27, 26, 25, 24, 23, 22, 21, 20, 2)
    ]
    assert _ids(ledger, "backup", session="agent:main:webui:deleg_old") == ["deleg_old"]
    assert _ids(ledger, "backup", session="agent:main:webui:deleg_mail") == []
    assert _ids(ledger, "backup", delivery_state="pending") == ["deleg_old"]
    assert _ids(ledger, "backup", delivery_state="dropped") == []
    assert ledger.query(RowQuery(text=None, limit=1000)) == ledger.query(RowQuery(limit=1000))


HOSTILE = [
    '"',
    '"backup',
    'backup"',
    '""backup""',
    "*",
    "back*",
    "*back",
    "NEAR",
    "NEAR(backup nightly)",
    "backup NEAR nightly",
    "NEAR/2",
    "-",
    "-backup",
    "backup -nightly",
    "backup OR job",
    "backup AND nightly",
    "NOT backup",
    "AND",
    "OR",
    "goal:backup",
    "{goal}: backup",
    "^backup",
    "(backup",
    "backup)",
    "backup & !nightly | x",
    "back:* & night:*",
    "<->",
    "'; DROP TABLE deliveries; --",
    "%s %(q)s ? $1",
    "\\",
    "\x00backup",
    "\ud800",
    "back\udfffup",
    "\udc80 nightly",
    "\u00e9t\u00e9 \u2603 \U0001f600",
    "x" * 10_000,
    "backup " * 2_000,
    " ".join(f"w{i}" for i in range(5_000)),
    "",
    "   ",
]


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_what_a_person_types_is_only_words(ledger: Ledger, text: str) -> None:
    """Quotes, FTS and tsquery operators, SQL, lone surrogates, 10k characters: each is
    searched as its words (or matches nothing when it has none), never an error."""
    _fill(ledger, 5)
    terms = search_terms(text)
    every = ledger.query(RowQuery(limit=1000))
    expected = [r.id for r in every if terms and holds_terms(r.goal or "", terms)]
    assert _ids(ledger, text, limit=1000) == expected


def test_operators_and_quotes_are_searched_as_the_words_they_hold(ledger: Ledger) -> None:
    _fill(ledger, 3)
    assert _ids(ledger, '"backup') == ["deleg_old"]
    assert _ids(ledger, "NEAR") == ["deleg_quote"]
    assert _ids(ledger, "near stars -flag") == ["deleg_quote"]
    assert _ids(ledger, "backup -nightly") == ["deleg_old"]  # "-" excludes nothing
    assert _ids(ledger, "summarise OR") == ["deleg_quote"]
    assert _ids(ledger, "backup OR job") == []  # OR is a word here, and no goal holds it


def test_text_without_a_word_matches_no_row(ledger: Ledger) -> None:
    _fill(ledger, 3)
    for text in ("", " ", "*", '"', "-", "\ud800", "::", "&|!"):
        assert _ids(ledger, text) == [], text


def test_a_pruned_row_leaves_the_index(ledger: Ledger, backend: Any, clock: FakeClock) -> None:
    ledger.create("deleg_gone", kind="delegation", state="running", goal="nightly backup")
    ledger.create("deleg_kept", kind="delegation", state="running", goal="nightly backup too")
    assert ledger.finish("deleg_gone", expected="running", state="completed", event={**EVENT})
    assert ledger.drop("deleg_gone", "test")
    clock.advance(10)
    assert backend.prune_settled(["deleg_gone"], clock() + 1, clock(), "test") == 1
    assert _ids(ledger, "nightly backup") == ["deleg_kept"]
    ledger.create("deleg_new", kind="delegation", goal="nightly backup again")
    assert _ids(ledger, "backup") == ["deleg_new", "deleg_kept"]


# --------------------------------------------------------------------------- SQLite's file


def test_sqlite_searches_through_its_fts_index(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    backend = sqlite_ledger(path)
    backend.close()
    where, params = query_filter("?", RowQuery(text="nightly back"), GOAL_SEARCH)
    raw = sqlite3.connect(path)
    plan = " | ".join(
        str(row[-1])
        for row in raw.execute(
            f"EXPLAIN QUERY PLAN SELECT id FROM deliveries{where} ORDER BY rowid DESC LIMIT 200",
            params,
        )
    )
    raw.close()
    # The matches come from the FTS index; each row is then fetched by its rowid.
    assert "SCAN deliveries_fts VIRTUAL TABLE INDEX" in plan, plan
    assert "SEARCH deliveries USING INTEGER PRIMARY KEY (rowid=?)" in plan, plan


def _open(path: Path, clock: FakeClock) -> Ledger:
    return Ledger(sqlite_ledger(path), clock=clock, monotonic=clock.monotonic)


def _filled_file(tmp_path: Path, clock: FakeClock, newer: int) -> Path:
    path = tmp_path / "ledger.db"
    ledger = _open(path, clock)
    _fill(ledger, newer)
    ledger.close()
    return path


def test_an_older_sqlite_ledger_is_indexed_on_open(tmp_path: Path, clock: FakeClock) -> None:
    path = _filled_file(tmp_path, clock, 20)
    # As a version-4 build left it: the rows, no text index, no triggers.
    raw = sqlite3.connect(path, isolation_level=None)
    raw.executescript(
        "DROP TRIGGER deliveries_fts_insert; DROP TRIGGER deliveries_fts_delete;"
        "DROP TRIGGER deliveries_fts_update; DROP TABLE deliveries_fts;"
        "PRAGMA user_version = 4;"
    )
    raw.execute(
        "INSERT INTO deliveries (id, kind, state, delivery_state, goal, created_at,"
        " updated_at) VALUES ('deleg_v4', 'delegation', 'queued', 'pending',"
        " 'written by version 4', 1, 1)"
    )
    raw.close()

    ledger = _open(path, clock)
    try:
        assert _ids(ledger, "backup") == ["deleg_old"]
        assert _ids(ledger, "version 4") == ["deleg_v4"]
        ledger.create("deleg_v5", kind="delegation", goal="written by version 5")
        assert _ids(ledger, "written version") == ["deleg_v5", "deleg_v4"]
    finally:
        ledger.close()
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION >= 5
    raw.close()
    index_intact(path, GOALS_INDEX)


def test_an_index_built_with_column_sizes_is_rebuilt_without_on_open(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Files made before kept each goal's size too (a page more per insert, never read):
    opening one rebuilds the index without, once, and every goal is still found."""
    path = _filled_file(tmp_path, clock, 20)
    older = GOALS_INDEX.ddl.replace(", columnsize = 0", "")
    assert older != GOALS_INDEX.ddl
    raw = sqlite3.connect(path, isolation_level=None)
    raw.executescript(GOALS_INDEX.drop + older + GOALS_INDEX.fill + ";")
    assert "columnsize" not in _index_sql(raw)
    raw.close()

    ledger = _open(path, clock)
    try:
        assert _ids(ledger, "backup") == ["deleg_old"]
        ledger.create("deleg_new", kind="delegation", goal="written after the rebuild")
        assert _ids(ledger, "rebuild") == ["deleg_new"]
    finally:
        ledger.close()
    raw = sqlite3.connect(path)
    assert "columnsize = 0" in _index_sql(raw)
    assert (
        raw.execute(
            "SELECT count(*) FROM sqlite_master"
            " WHERE type = 'trigger' AND name LIKE 'deliveries_fts_%'"
        ).fetchone()[0]
        == 3
    )
    raw.close()
    index_intact(path, GOALS_INDEX)


def _index_sql(conn: sqlite3.Connection) -> str:
    return str(
        conn.execute("SELECT sql FROM sqlite_master WHERE name = 'deliveries_fts'").fetchone()[0]
    )


def test_the_index_follows_deletes_goal_changes_and_vacuum(
    tmp_path: Path, clock: FakeClock
) -> None:
    path = _filled_file(tmp_path, clock, 50)
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("DELETE FROM deliveries WHERE id LIKE 'deleg_newer000%' OR id = 'proc_none'")
    raw.execute("UPDATE deliveries SET goal = 'weekly restore' WHERE id = 'deleg_mail'")
    raw.execute("UPDATE deliveries SET goal = NULL WHERE id = 'deleg_under'")
    raw.execute("UPDATE deliveries SET goal = 'was empty' WHERE id = 'deleg_newer0010'")
    index_intact(path, GOALS_INDEX)
    # VACUUM (``reveille prune`` converting an old file) must keep deliveries' rowids, gaps
    # and all, or the index would point at other rows.
    rowids = raw.execute("SELECT rowid, id FROM deliveries ORDER BY rowid").fetchall()
    raw.execute("VACUUM")
    assert raw.execute("SELECT rowid, id FROM deliveries ORDER BY rowid").fetchall() == rowids
    raw.close()
    index_intact(path, GOALS_INDEX)
    ledger = _open(path, clock)
    try:
        assert _ids(ledger, "backup") == ["deleg_old"]
        assert _ids(ledger, "weekly") == ["deleg_mail"] and _ids(ledger, "quarterly") == []
        assert _ids(ledger, "rotate") == [] and _ids(ledger, "empty") == ["deleg_newer0010"]
        assert _ids(ledger, "job 1 checks", limit=3) == [
            "deleg_newer0019",
            "deleg_newer0018",
            "deleg_newer0017",
        ]
    finally:
        ledger.close()


def test_goals_are_indexed_in_batches_and_a_search_never_misses_one(
    tmp_path: Path, clock: FakeClock
) -> None:
    """An insert's own commit leaves the text index alone (its pages would be fsynced with
    the row); the writer indexes each full batch after it, and a search indexes what is left
    first, so it finds a goal written a moment before."""
    path = tmp_path / "ledger.db"
    ledger = _open(path, clock)
    try:
        ledger.create("deleg_first", kind="delegation", goal="nightly backup")
        assert indexed(path, GOALS_INDEX) == (0, 1)  # committed, not indexed yet
        assert _ids(ledger, "backup") == ["deleg_first"]
        assert indexed(path, GOALS_INDEX) == (1, 0)
        futures = [
            ledger.submit_create(f"deleg_b{i:04d}", kind="delegation", goal=f"batch {i:04d}")
            for i in range(GOALS_BATCH)
        ]
        for future in futures:
            future.result()
        ledger.create("deleg_after", kind="delegation", goal="after the batch")
        # The batch's indexing was queued behind the inserts: flush the writer's queue.
        ledger.backend.write(lambda tx: None)
        upto, tail = indexed(path, GOALS_INDEX)
        assert upto >= GOALS_BATCH and tail < GOALS_BATCH  # a full batch was indexed
        assert _ids(ledger, "batch 0007") == ["deleg_b0007"]
        assert _ids(ledger, "after batch") == ["deleg_after"]
    finally:
        ledger.close()
    assert indexed(path, GOALS_INDEX)[1] == 0  # closed in order: everything indexed
    index_intact(path, GOALS_INDEX)


def test_a_batch_filled_while_the_writer_closes_never_fails_its_insert(tmp_path: Path) -> None:
    """The insert that fills a batch queues its indexing; with the writer closing (its
    queue still being written), that queueing is skipped, not raised into the insert."""
    backend = sqlite_ledger(tmp_path / "ledger.db")
    writer = backend._writer  # type: ignore[attr-defined]
    writer.close()
    backend._goals.inserted(GOALS_BATCH)  # type: ignore[attr-defined]
    backend.close()


def test_rows_left_unindexed_by_a_crash_are_found_and_follow_deletes(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Rows a killed server wrote after the last batch (the tail, as it left the file) are
    indexed by the next search; a tail row deleted or changed before that is indexed as it
    is then; a key reused after the last indexed row was deleted is indexed at once."""
    path = _filled_file(tmp_path, clock, 10)
    raw = sqlite3.connect(path, isolation_level=None)
    for i, goal in enumerate(("crash survivor", "pruned before indexing", "renamed later")):
        raw.execute(
            "INSERT INTO deliveries (id, kind, state, delivery_state, goal, created_at,"
            " updated_at) VALUES (?, 'delegation', 'running', 'pending', ?, 1, 1)",
            (f"deleg_tail{i}", goal),
        )
    raw.execute("DELETE FROM deliveries WHERE id = 'deleg_tail1'")
    raw.execute("UPDATE deliveries SET goal = 'renamed weekly' WHERE id = 'deleg_tail2'")
    raw.close()
    assert indexed(path, GOALS_INDEX)[1] == 2
    ledger = _open(path, clock)
    try:
        assert _ids(ledger, "survivor") == ["deleg_tail0"]
        assert _ids(ledger, "pruned") == [] and _ids(ledger, "later") == []
        assert _ids(ledger, "renamed weekly") == ["deleg_tail2"]
    finally:
        ledger.close()
    index_intact(path, GOALS_INDEX)
    raw = sqlite3.connect(path, isolation_level=None)
    (last,) = raw.execute("SELECT max(rowid) FROM deliveries").fetchone()
    raw.execute("DELETE FROM deliveries WHERE rowid = ?", (last,))
    raw.execute(
        "INSERT INTO deliveries (id, kind, state, delivery_state, goal, created_at,"
        " updated_at) VALUES ('deleg_reused', 'delegation', 'running', 'pending',"
        " 'reused key', 1, 1)"
    )
    (reused,) = raw.execute("SELECT rowid FROM deliveries WHERE id = 'deleg_reused'").fetchone()
    assert reused <= last == indexed(path, GOALS_INDEX)[0]
    raw.close()
    index_intact(path, GOALS_INDEX)  # indexed by its insert: at the mark, not above it


def test_a_file_with_per_insert_triggers_keeps_its_index_and_gets_a_mark(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A file from before the batches (its index complete, triggers on every insert) gets
    the guarded triggers and its mark at its last row on open, without a rebuild."""
    path = _filled_file(tmp_path, clock, 20)
    raw = sqlite3.connect(path, isolation_level=None)
    older = TextIndex("deliveries_fts", "deliveries", "goal", column_sizes=False)
    raw.executescript(GOALS_INDEX.drop + older.ddl + older.fill + ";")
    (segments,) = raw.execute("SELECT count(*) FROM deliveries_fts_data").fetchone()
    raw.close()

    ledger = _open(path, clock)
    try:
        assert indexed(path, GOALS_INDEX)[1] == 0
        raw = sqlite3.connect(path)
        triggers = [
            sql
            for (sql,) in raw.execute(
                "SELECT sql FROM sqlite_master WHERE type = 'trigger'"
                " AND name LIKE 'deliveries_fts_%'"
            )
        ]
        assert len(triggers) == 3 and all("deliveries_fts_mark" in sql for sql in triggers)
        # The index was kept, not built again.
        assert raw.execute("SELECT count(*) FROM deliveries_fts_data").fetchone() == (segments,)
        raw.close()
        assert _ids(ledger, "backup") == ["deleg_old"]
        ledger.create("deleg_new", kind="delegation", goal="written after the mark")
        assert _ids(ledger, "mark") == ["deleg_new"]
    finally:
        ledger.close()
    index_intact(path, GOALS_INDEX)


# --------------------------------------------------------------------------- PostgreSQL


def test_postgres_migration_indexes_the_goals_already_there(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    """A database at version 12 (before the goal index) gains one that holds its rows, and
    the search uses it."""
    import psycopg

    from storage.postgres import migrations
    from tests.pg_support import fresh_url
    from tests.stores import pg_ledger

    url = fresh_url()
    before = tuple(m for m in migrations.MIGRATIONS if m.version <= 12)
    with monkeypatch.context() as patch:
        patch.setattr(migrations, "MIGRATIONS", before)
        patch.setattr(migrations, "SCHEMA_VERSION", 12)
        with psycopg.connect(url, autocommit=True) as conn:
            migrations.migrate(conn)
            conn.execute(
                "INSERT INTO deliveries (id, kind, state, delivery_state, goal, created_at,"
                " updated_at) VALUES ('deleg_v12', 'delegation', 'queued', 'pending',"
                " 'nightly backup of /srv/data', 1, 1)"
            )
    ledger = Ledger(pg_ledger(url), clock=clock, monotonic=clock.monotonic)
    try:
        assert _ids(ledger, "data back") == ["deleg_v12"]
    finally:
        ledger.close()
    with psycopg.connect(url, autocommit=True) as conn:
        # One row: left alone, the planner walks it by seq; what counts is that the search's
        # expression is the index's, so the index can answer it.
        conn.execute("SET enable_seqscan = off")
        conn.execute("SET enable_indexscan = off")
        plan = " ".join(
            str(row[0])
            for row in conn.execute(
                f"EXPLAIN {pg_sql.LEDGER_SELECT} WHERE {pg_sql.LEDGER_GOAL_MATCH}"
                " ORDER BY seq DESC LIMIT 200",
                ("backup:*",),
            )
        )
    assert "ix_deliveries_goal_words" in plan, plan
