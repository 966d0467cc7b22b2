"""SessionStore: SQLite persistence, file safety, dedupe and exactly-once folding."""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import stat
import threading
from pathlib import Path

import pytest

from gateway.config import Platform
from gateway.session import (
    SessionGone,
    SessionSource,
    SessionStore,
    SessionStoreError,
    build_session_key,
    is_valid_session_id,
)


@pytest.fixture
def store(tmp_path: Path):
    s = SessionStore(tmp_path / "sessions.db")
    yield s
    s.close()


def _delivery(store: SessionStore, sid: str, n: int) -> dict:
    return store.append_message(
        sid,
        "system",
        f"delivery {n}",
        display_kind="async_delegation_complete",
        display_metadata={"n": n},
        dedupe_key=f"deleg:{n}",
    )


# ----------------------------------------------------------------- file handling


def test_creates_parent_dir_and_private_files(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "state.db"
    s = SessionStore(path)
    try:
        s.create_session("s1")
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
    with store._read() as c:  # the store's own connection settings
        assert c.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert c.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert c.execute("PRAGMA busy_timeout").fetchone()[0] >= 1000


def test_not_a_database_is_refused_and_left_intact(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    payload = b"these are my notes, not a database\n" * 20
    path.write_bytes(payload)
    with pytest.raises(SessionStoreError, match="not a usable SQLite database"):
        SessionStore(path)
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
        SessionStore(path)
    assert path.read_bytes() == before  # not even switched to WAL


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(SessionStoreError, match="newer"):
        SessionStore(path)


def test_directory_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SessionStoreError):
        SessionStore(tmp_path)


def test_reopen_keeps_data(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with SessionStore(path) as s:
        s.create_session("keep", title="t")
        s.append_message("keep", "user", "hi")
    with SessionStore(path) as s:
        assert s.get_session("keep")["title"] == "t"
        assert [m["content"] for m in s.messages("keep")] == ["hi"]


def test_closed_store_raises(tmp_path: Path) -> None:
    s = SessionStore(tmp_path / "s.db")
    s.close()
    s.close()  # idempotent
    with pytest.raises(SessionStoreError, match="closed"):
        s.get_session("x")


# ----------------------------------------------------------------- sessions


def test_session_id_validation() -> None:
    assert is_valid_session_id("sess_abc")
    assert is_valid_session_id("a.b:c-d_e")
    assert is_valid_session_id("x" * 128)
    for bad in ["", "x" * 129, "a b", "a/b", "a\nb", "é", None, 5, "abc\n"]:
        assert not is_valid_session_id(bad), bad


def test_create_get_list_delete(store: SessionStore) -> None:
    src = SessionSource(Platform.TELEGRAM, chat_id="c1", chat_type="group")
    a = store.create_session(source=src, title="first")
    assert a["id"].startswith("sess_") and is_valid_session_id(a["id"])
    assert a["source"] == src.to_dict()
    assert a["session_key"] == build_session_key(src)
    assert store.get_session(a["id"]) == a

    b = store.create_session("api-123")
    assert b["source"] is None and b["session_key"] is None and b["title"] is None
    store.append_message("api-123", "user", "bump")  # most recently active first
    assert [s["id"] for s in store.list_sessions()] == ["api-123", a["id"]]
    assert [s["id"] for s in store.list_sessions(limit=1, offset=1)] == [a["id"]]

    assert store.delete_session(a["id"]) is True
    assert store.delete_session(a["id"]) is False
    assert store.get_session(a["id"]) is None


def test_create_existing_returns_existing_unchanged(store: SessionStore) -> None:
    first = store.create_session("same", title="original")
    again = store.create_session("same", title="other")
    assert again == first


def test_create_rejects_bad_id_and_source(store: SessionStore) -> None:
    with pytest.raises(ValueError):
        store.create_session("has space")
    with pytest.raises(TypeError):
        store.create_session("ok", source={"platform": "telegram"})  # type: ignore[arg-type]


def test_list_rejects_negative(store: SessionStore) -> None:
    with pytest.raises(ValueError):
        store.list_sessions(limit=-1)


def test_delete_cascades_messages(store: SessionStore, tmp_path: Path) -> None:
    store.create_session("s")
    store.append_message("s", "user", "hi")
    store.delete_session("s")
    conn = sqlite3.connect(tmp_path / "sessions.db")
    try:
        assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 0
    finally:
        conn.close()


# ----------------------------------------------------------------- messages


def test_append_and_read_messages(store: SessionStore) -> None:
    store.create_session("s")
    m1 = store.append_message("s", "user", "hello")
    m2 = store.append_message("s", "assistant", "hi there")
    m3 = _delivery(store, "s", 1)
    assert set(m1) == {
        "id",
        "role",
        "content",
        "created_at",
        "display_kind",
        "display_metadata",
        "folded",
    }
    assert m1["display_kind"] is None and m1["display_metadata"] is None
    assert m3["display_metadata"] == {"n": 1} and m3["folded"] is False
    assert [m["id"] for m in store.messages("s")] == [m1["id"], m2["id"], m3["id"]]
    assert [m["id"] for m in store.messages("s", after_id=m1["id"])] == [m2["id"], m3["id"]]
    assert [m["id"] for m in store.messages("s", limit=1)] == [m1["id"]]
    assert store.messages("s", after_id=m3["id"]) == []


def test_unknown_session_raises_key_error(store: SessionStore) -> None:
    with pytest.raises(SessionGone):
        store.append_message("ghost", "user", "x")
    with pytest.raises(SessionGone):
        store.messages("ghost")
    with pytest.raises(SessionGone):
        store.take_unfolded_deliveries("ghost")


def test_append_validates_arguments(store: SessionStore) -> None:
    store.create_session("s")
    with pytest.raises(ValueError):
        store.append_message("s", "", "x")
    with pytest.raises(TypeError):
        store.append_message("s", "user", None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        store.append_message("s", "user", "x", display_metadata={"bad": object()})
    assert store.messages("s") == []


def test_dedupe_key_never_appends_twice(store: SessionStore) -> None:
    store.create_session("s")
    store.create_session("t")
    first = _delivery(store, "s", 7)
    again = store.append_message("s", "system", "different text", dedupe_key="deleg:7")
    assert again == first
    assert len(store.messages("s")) == 1
    # The key is unique per session, not globally.
    other = _delivery(store, "t", 7)
    assert other["id"] != first["id"]
    # No key means no dedupe.
    store.append_message("s", "user", "same")
    store.append_message("s", "user", "same")
    assert len(store.messages("s")) == 3


def test_message_ids_not_reused_after_delete(store: SessionStore) -> None:
    store.create_session("s")
    last = store.append_message("s", "user", "x")
    store.delete_session("s")
    store.create_session("s")
    assert store.append_message("s", "user", "y")["id"] > last["id"]


# ----------------------------------------------------------------- folding


def test_take_unfolded_deliveries_exactly_once(store: SessionStore) -> None:
    store.create_session("s")
    store.append_message("s", "user", "plain message is not a delivery")
    d1 = _delivery(store, "s", 1)
    d2 = _delivery(store, "s", 2)
    taken = store.take_unfolded_deliveries("s")
    assert [m["id"] for m in taken] == [d1["id"], d2["id"]]
    assert all(m["folded"] for m in taken)
    assert store.take_unfolded_deliveries("s") == []
    d3 = _delivery(store, "s", 3)
    assert [m["id"] for m in store.take_unfolded_deliveries("s")] == [d3["id"]]
    # The transcript still shows them, now marked folded.
    folded = {m["id"]: m["folded"] for m in store.messages("s")}
    assert folded[d1["id"]] and folded[d3["id"]]
    # A redelivery of an already folded completion does not resurrect it.
    _delivery(store, "s", 1)
    assert store.take_unfolded_deliveries("s") == []


def _race(stores: list[SessionStore], sid: str, total: int, threads: int) -> list[int]:
    taken: list[int] = []
    taken_lock = threading.Lock()
    start = threading.Barrier(threads + 1)
    done_writing = threading.Event()

    def writer() -> None:
        start.wait()
        for n in range(total):
            _delivery(stores[0], sid, n)
        done_writing.set()

    def reader(s: SessionStore) -> None:
        start.wait()
        while True:
            finished = done_writing.is_set()
            got = s.take_unfolded_deliveries(sid)
            with taken_lock:
                taken.extend(m["id"] for m in got)
            if finished and not got:
                return

    workers = [threading.Thread(target=writer)]
    workers += [
        threading.Thread(target=reader, args=(stores[i % len(stores)],)) for i in range(threads - 1)
    ]
    for w in workers:
        w.start()
    start.wait()
    for w in workers:
        w.join(timeout=60)
    assert not any(w.is_alive() for w in workers)
    return taken


def test_take_unfolded_races_on_one_store(store: SessionStore) -> None:
    store.create_session("s")
    taken = _race([store], "s", total=150, threads=5)
    assert len(taken) == len(set(taken)) == 150


def test_take_unfolded_races_across_connections(tmp_path: Path) -> None:
    # Two stores on one file behave like two processes: atomicity comes from SQLite's
    # IMMEDIATE transactions, not from the in-process lock.
    a = SessionStore(tmp_path / "shared.db")
    b = SessionStore(tmp_path / "shared.db")
    try:
        a.create_session("s")
        taken = _race([a, b], "s", total=150, threads=5)
        assert len(taken) == len(set(taken)) == 150
    finally:
        a.close()
        b.close()


async def test_usable_from_async_via_to_thread(store: SessionStore) -> None:
    await asyncio.to_thread(store.create_session, "s")
    await asyncio.gather(
        *(asyncio.to_thread(store.append_message, "s", "user", str(i)) for i in range(20))
    )
    assert len(await asyncio.to_thread(store.messages, "s")) == 20
