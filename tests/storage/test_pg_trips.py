"""The round trips a PostgreSQL turn pays, counted (``storage.postgres.trips``).

Each trip is a thread hop and a wait on the server, which is what made a turn on PostgreSQL
a third as fast as one on SQLite: a new conversation's read and its first turn's write were
18 trips (a checking trip per checkout, BEGIN and COMMIT around reads, one statement each),
then 9 (a write waited for row counts nobody read: the session's insert and its touch, and
asked whether the session it had just created was live, and whether a new id was live and
then whether it was tombstoned in two statements, and sent BEGIN and the lock in a trip of
their own, and read the id's tombstone after its sessions); they are 3 now (the lookup, the
write with its lock, COMMIT), and a later turn's write is 2 (BEGIN, the lock and the liveness
check in one trip, then COMMIT): neither may creep back.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import storage
from gateway.config import Platform
from gateway.session import SessionSource, SessionStore
from storage.postgres import trips
from tests.pg_support import fresh_url


def test_a_pipeline_is_one_trip_and_a_statement_outside_one_is_one_each() -> None:
    conn = trips.CountingConnection.connect(fresh_url(), autocommit=True)
    try:
        before = trips.total()
        conn.execute("SELECT 1").fetchone()
        conn.execute("SELECT 2").fetchone()
        assert trips.total() - before == 2
        before = trips.total()
        with conn.pipeline():
            for n in range(5):
                conn.execute("SELECT %s", (n,))
        assert trips.total() - before == 1
    finally:
        conn.close()


async def test_a_new_conversations_read_and_first_turn_make_three_trips(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(trips.ENV, str(tmp_path))  # the stores open counting connections
    store = SessionStore(storage.open_storage(fresh_url()).open_sessions())
    try:
        for n in range(2):  # the second one runs on warm, prepared connections
            session_id = f"api-{n}"
            before = trips.total()
            await store.asessions_by_prefix(session_id)
            await store.aappend_turn(
                session_id,
                [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
                create=SessionSource(platform=Platform.API_SERVER, chat_id=session_id),
                title="hi",
            )
            assert trips.total() - before <= 3
        assert [m.content for m in store.messages("api-1")] == ["hi", "hello"]
        before = trips.total()
        await store.aappend_turn("api-1", [{"role": "user", "content": "again"}])
        assert trips.total() - before <= 2
        assert [m.content for m in store.messages("api-1")][-1] == "again"
    finally:
        store.close()
