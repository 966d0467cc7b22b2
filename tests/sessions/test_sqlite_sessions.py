"""The SQLite session backend's own facts: the file (0600, WAL, pragmas), refusals of foreign,
newer, locked or corrupt files, schema upgrade, and atomicity across connections."""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from delivery.session_backend import ApprovalRecord
from delivery.session_rows import SessionRows
from gateway.session import SessionStore, SessionStoreError
from storage.sqlite.sessions import SqliteRows, SqliteSessions
from storage.sqlite.sessions_sql import SCHEMA_VERSION
from tests.sessions._support import make_session, race, state_of
from tests.stores import session_file_store, sqlite_sessions

_PRAGMAS = ("synchronous", "foreign_keys", "busy_timeout")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SessionStore]:
    s = session_file_store(tmp_path / "sessions.db")
    yield s
    s.close()


def test_creates_parent_dir_and_private_files(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "state.db"
    s = session_file_store(path)
    try:
        make_session(s, "s1")
        for p in [path, *path.parent.glob("state.db-*")]:
            assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
        assert s.path == path
    finally:
        s.close()


def test_pragmas(store: SessionStore, tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "sessions.db")
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()
    backend = store.backend
    assert isinstance(backend, SqliteSessions)

    def pragmas(rows: SessionRows) -> tuple[int, int, int]:
        c = cast(SqliteRows, rows).conn  # the reader connection, as the backend uses it
        synchronous, foreign_keys, busy = (c.execute(f"PRAGMA {p}").fetchone()[0] for p in _PRAGMAS)
        return int(synchronous), int(foreign_keys), int(busy)

    synchronous, foreign_keys, busy_timeout = backend.tx.read(pragmas)
    assert synchronous == 2  # FULL
    assert foreign_keys == 1
    assert busy_timeout >= 1000


def test_not_a_database_is_refused_and_left_intact(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    payload = b"these are my notes, not a database\n" * 20
    path.write_bytes(payload)
    with pytest.raises(SessionStoreError, match="not a usable SQLite database"):
        session_file_store(path)
    assert path.read_bytes() == payload
    assert hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(payload).digest()
    assert not (tmp_path / "notes.txt-wal").exists()


def test_foreign_sqlite_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE sessions (id TEXT PRIMARY KEY, owner TEXT)")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(SessionStoreError, match="lacks columns"):
        session_file_store(path)
    assert path.read_bytes() == before  # not even switched to WAL


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(SessionStoreError, match="newer"):
        session_file_store(path)


def test_directory_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SessionStoreError):
        session_file_store(tmp_path)


def test_reopen_keeps_data(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with session_file_store(path) as s:
        make_session(s, "keep", title="t")
        s.append_message("keep", "user", "hi")
    with session_file_store(path) as s:
        assert s.get_session("keep").title == "t"
        assert [m.content for m in s.messages("keep")] == ["hi"]


def test_closed_store_raises(tmp_path: Path) -> None:
    s = session_file_store(tmp_path / "s.db")
    s.close()
    s.close()  # idempotent
    with pytest.raises(SessionStoreError, match="closed"):
        s.get_session("x")


def test_delete_cascades_messages(store: SessionStore, tmp_path: Path) -> None:
    make_session(store, "s")
    store.append_message("s", "user", "hi")
    store.delete_session("s")
    conn = sqlite3.connect(tmp_path / "sessions.db")
    try:
        assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 0
    finally:
        conn.close()


def test_take_unfolded_races_across_connections(tmp_path: Path) -> None:
    # Two stores on one file behave like two processes: atomicity comes from SQLite's
    # IMMEDIATE transactions, not from the in-process lock.
    a = session_file_store(tmp_path / "shared.db")
    b = session_file_store(tmp_path / "shared.db")
    try:
        make_session(a, "s")
        taken = race([a, b], "s", total=150, threads=5)
        assert len(taken) == len(set(taken)) == 150
    finally:
        a.close()
        b.close()


def test_the_opener_names_the_sqlite_file(tmp_path: Path) -> None:
    with session_file_store(tmp_path / "x.db") as s:
        assert s.url == f"sqlite://{tmp_path / 'x.db'}"
        assert s.path == tmp_path / "x.db"


def test_v1_file_is_upgraded_in_place(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    with session_file_store(path) as s:
        make_session(s, "old")
        s.append_message("old", "user", "kept")
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE tombstones")
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    with session_file_store(path) as s:
        assert [m.content for m in s.messages("old")] == ["kept"]
        s.delete_session("old")
        assert state_of(s, "old") == "deleted"
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        conn.close()


def test_an_older_approvals_table_gains_the_background_columns(tmp_path: Path) -> None:
    path = tmp_path / "v5.db"
    with session_file_store(path) as s:
        make_session(s, "old")
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE approvals")  # as a build before background approvals wrote it
    conn.execute(
        "CREATE TABLE approvals (id TEXT PRIMARY KEY, session_id TEXT NOT NULL,"
        " stream_id TEXT NOT NULL, command TEXT NOT NULL, status TEXT NOT NULL,"
        " created_at REAL NOT NULL)"
    )
    conn.execute("INSERT INTO approvals VALUES ('appr_old', 'old', 'st', 'ls', 'denied', 1.0)")
    conn.commit()
    conn.close()
    with session_file_store(path) as s:
        old = s.get_approval("appr_old")
        assert old is not None and not old.background and old.expires_at == 0.0
        unit = ApprovalRecord(
            "appr_new", "old", "", "ls", "pending", time.time(), "deleg_1", "me", time.time() + 9
        )
        assert s.ask_approval(unit)
        assert s.pending_unit_approvals() == [unit]


def test_tombstones_survive_reopen(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    with session_file_store(path) as s:
        make_session(s, "gone")
        s.delete_session("gone")
    with session_file_store(path) as s:
        assert state_of(s, "gone") == "deleted"


def test_locked_database_is_unavailable_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    s = SessionStore(sqlite_sessions(path, busy_timeout_ms=50))
    try:
        make_session(s, "s")
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        try:
            with pytest.raises(SessionStoreError, match="nothing was written"):
                s.append_message("s", "user", "x")
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert s.messages("s") == []
    finally:
        s.close()


def test_corrupt_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "corrupt.db"
    with session_file_store(path) as s:
        make_session(s, "s")
    data = bytearray(path.read_bytes())
    data[:16] = b"garbage-header!!"  # the SQLite magic string is gone
    path.write_bytes(bytes(data))
    with pytest.raises(SessionStoreError, match="not a usable SQLite database"):
        session_file_store(path)


async def test_begin_turns_race_across_connections(tmp_path: Path) -> None:
    # Two stores on one file behave like two processes: the fold is disjoint because the
    # writer re-reads inside its IMMEDIATE transaction, not because of an in-process lock.
    a = session_file_store(tmp_path / "shared.db")
    b = session_file_store(tmp_path / "shared.db")
    try:
        make_session(a, "s")
        ids = {a.append_message("s", "system", str(n), display_kind="d").id for n in range(30)}
        starts = await asyncio.gather(*(s.abegin_turn("s") for s in [a, b] * 6))
        taken = [m.id for start in starts for m in start.taken]
        assert sorted(taken) == sorted(ids)
    finally:
        a.close()
        b.close()
