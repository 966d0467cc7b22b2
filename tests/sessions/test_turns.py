"""Conformance of turns: atomic turns, idempotency keys, tombstones, create-with-first-turn,
and begin-turn reads that reach the writer only to fold (each test runs on every backend)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from gateway.config import Platform
from gateway.session import (
    SessionGone,
    SessionSource,
    SessionStore,
    TurnStart,
    build_session_key,
)
from tests.sessions._support import (
    append_turn,
    begin,
    delivery,
    make_session,
    run_sync,
    state_of,
    writes,
)

API = SessionSource(platform=Platform.API_SERVER, chat_id="sess_new")
PROBE = "probe:0:z"


def idempotency_record(store: SessionStore, key: str) -> dict | None:
    """The record a repeat of ``key`` finds, as the turn service asks for it (a claim):
    None when there is none, so that a repeat runs the request (the probe's claim is
    released again)."""
    row = store.claim_idempotent(key, PROBE)
    if row["claimed"]:
        assert store.release_idempotent(key, PROBE)
        return None
    return row


TURN = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


@pytest.fixture
def store_a(store: SessionStore) -> SessionStore:
    make_session(store, "sess_a")
    return store


# ----------------------------------------------------------------- atomic turns


def test_append_turn_records_messages_and_response_together(store_a: SessionStore) -> None:
    rows = append_turn(store_a, "sess_a", TURN, idempotency_key="k1", response={"id": "c-1"})
    assert [r.role for r in rows] == ["user", "assistant"]
    row = idempotency_record(store_a, "k1")
    assert row is not None
    assert row["state"] == "done" and row["response"] == {"id": "c-1"}
    assert row["session_id"] == "sess_a"


def test_append_turn_to_unknown_session_writes_nothing(store_a: SessionStore) -> None:
    with pytest.raises(SessionGone):
        append_turn(
            store_a,
            "sess_gone",
            [{"role": "user", "content": "x"}],
            idempotency_key="k",
            response={},
        )
    assert idempotency_record(store_a, "k") is None


def test_append_turn_dedupes_by_key(store_a: SessionStore) -> None:
    turn = [{"role": "user", "content": "x", "dedupe_key": "idem:k:user"}]
    append_turn(store_a, "sess_a", turn)
    append_turn(store_a, "sess_a", turn)
    assert len(store_a.messages("sess_a")) == 1


async def test_aappend_turn_matches_append_turn(store_a: SessionStore) -> None:
    assert await store_a.aappend_turn("sess_a", TURN, idempotency_key="k", response={}) is None
    assert [m.content for m in store_a.messages("sess_a")] == ["hi", "hello"]
    with pytest.raises(SessionGone):
        await store_a.aappend_turn("nope", TURN)


def test_append_turn_validates_before_writing(store_a: SessionStore) -> None:
    with pytest.raises(TypeError):
        append_turn(store_a, "sess_a", [{"role": "user", "content": "ok"}, {"role": "user"}])
    with pytest.raises(TypeError):
        append_turn(store_a, "sess_a", TURN, idempotency_key="k", response={"x": object()})
    assert store_a.messages("sess_a") == [] and idempotency_record(store_a, "k") is None


def test_claim_wait_takeover_and_release(store_a: SessionStore) -> None:
    store = store_a
    first = store.claim_idempotent("k", "p:1:a", session_id="sess_a")
    assert first["claimed"] and first["state"] == "running"
    again = store.claim_idempotent("k", "p:1:a")
    assert again["claimed"]  # the holder asking again still holds it
    other = store.claim_idempotent("k", "p:1:b")
    assert not other["claimed"] and other["state"] == "running"
    taken = store.claim_idempotent("k", "q:2:c", takeover=lambda owner: owner.startswith("p:"))
    assert taken["claimed"] and taken["owner"] == "q:2:c"
    assert not store.release_idempotent("k", "p:1:a")  # not the holder any more
    assert store.release_idempotent("k", "q:2:c")
    assert idempotency_record(store, "k") is None
    store.claim_idempotent("k", "r:3:d")
    # The holder stores its turn with the response: the key is done from then on.
    append_turn(store, "sess_a", TURN, idempotency_key="k", response={"id": "done"})
    done = store.claim_idempotent("k", "s:4:e", takeover=lambda owner: True)
    assert not done["claimed"] and done["response"] == {"id": "done"}
    assert not store.release_idempotent("k", "s:4:e")  # a done row is never released
    with pytest.raises(ValueError):
        store.claim_idempotent("", "x")


def test_idempotency_record_survives_session_delete(store_a: SessionStore) -> None:
    append_turn(store_a, "sess_a", TURN, idempotency_key="k", response={"id": "c"})
    store_a.delete_session("sess_a")
    row = idempotency_record(store_a, "k")
    assert row is not None and row["response"] == {"id": "c"}


def test_find_session_by_key(store: SessionStore) -> None:
    source = SessionSource(platform=Platform.API_SERVER, chat_id="sess_k")
    make_session(store, "sess_k", source=source)
    found = store.find_session_by_key(build_session_key(source))
    assert found is not None and found.id == "sess_k"
    assert store.find_session_by_key("agent:main:nothing") is None


# ----------------------------------------------------------------- tombstones


def test_a_turn_tells_unknown_from_deleted(store: SessionStore) -> None:
    assert state_of(store, "sess_x") == "unknown"
    make_session(store, "sess_x")
    assert state_of(store, "sess_x") == "live"
    assert store.delete_session("sess_x") is True
    assert state_of(store, "sess_x") == "deleted"
    assert store.get_session("sess_x") is None
    make_session(store, "sess_x")  # explicit creation revives the id
    assert state_of(store, "sess_x") == "live"


def test_delete_of_an_unwritten_id_still_tombstones(store: SessionStore) -> None:
    # A DELETE that races a session's first turn (not stored yet) must still win.
    assert store.delete_session("sess_early") is False
    assert state_of(store, "sess_early") == "deleted"
    with pytest.raises(SessionGone):
        append_turn(store, "sess_early", TURN, create=API)


async def test_late_writes_into_a_deleted_session_raise(store_a: SessionStore) -> None:
    store_a.delete_session("sess_a")
    with pytest.raises(SessionGone):
        store_a.append_message("sess_a", "user", "late")
    with pytest.raises(SessionGone):
        append_turn(store_a, "sess_a", TURN)
    with pytest.raises(SessionGone):
        append_turn(store_a, "sess_a", TURN, create=API, idempotency_key="k", response={})
    with pytest.raises(SessionGone):
        await store_a.aappend_turn("sess_a", TURN, create=API)
    start = await store_a.abegin_turn("sess_a")
    assert start == TurnStart("deleted")  # a turn finds it gone, and folds nothing
    assert idempotency_record(store_a, "k") is None


async def test_begin_turn_with_create_revives_a_deleted_id(store_a: SessionStore) -> None:
    # Today's rule for derived API ids: a new conversation after a delete starts afresh.
    store_a.append_message("sess_a", "user", "old")
    store_a.delete_session("sess_a")
    start = await store_a.abegin_turn("sess_a", create_with=API)
    assert start == TurnStart("deleted")  # found deleted, created afresh: nothing of old
    assert (await store_a.abegin_turn("sess_a")) == TurnStart("live")


# ----------------------------------------------------------------- create with the first turn


async def test_first_turn_creates_its_session_in_one_write(store: SessionStore) -> None:
    start = await store.abegin_turn("sess_new")
    assert start == TurnStart("unknown")
    before = writes(store)
    await store.aappend_turn(
        "sess_new", TURN, create=API, title="t", idempotency_key="k", response={"id": "c"}
    )
    assert writes(store) == before + 1
    session = store.get_session("sess_new")
    assert session is not None and session.title == "t"
    assert session.source == API.to_dict()
    assert session.session_key == build_session_key(API)
    assert [m.content for m in store.messages("sess_new")] == ["hi", "hello"]
    record = idempotency_record(store, "k")
    assert record is not None and record["session_id"] == "sess_new"


def test_create_keeps_an_existing_session(store_a: SessionStore) -> None:
    store_a.append_message("sess_a", "user", "first")
    rows = append_turn(store_a, "sess_a", TURN, create=API, title="ignored")
    assert [r.content for r in rows] == ["hi", "hello"]
    session = store_a.get_session("sess_a")
    assert session is not None and session.title is None and session.source is None
    assert len(store_a.messages("sess_a")) == 3


def test_create_refuses_a_bad_id(store: SessionStore) -> None:
    with pytest.raises(ValueError):
        append_turn(store, "bad id", TURN, create=API)
    with pytest.raises(TypeError):
        append_turn(store, "ok", TURN, create={"platform": "api_server"})  # type: ignore[arg-type]


# ----------------------------------------------------------------- begin turn


async def test_begin_turn_with_nothing_to_fold_only_reads(store_a: SessionStore) -> None:
    store = store_a
    append_turn(store, "sess_a", TURN)
    folded = delivery(store, "sess_a", 1)
    await store.abegin_turn("sess_a")  # folds it
    before = writes(store)
    start = await store.abegin_turn("sess_a")
    assert start.history[-1].id == folded.id and start.taken == ()
    await store.abegin_turn("sess_a", create_with=API)  # exists: nothing to create either
    assert start.state == "live" and len(start.history) == 3
    assert await store.abegin_turn("ghost") == TurnStart("unknown")
    assert await store.abegin_turn("sess_a") == start
    assert writes(store) == before


async def test_begin_turn_folds_what_waits_once(store_a: SessionStore) -> None:
    store = store_a
    d1 = delivery(store, "sess_a", 1)
    before = writes(store)
    start = await store.abegin_turn("sess_a")
    assert writes(store) == before + 1  # the fold is a write
    assert [m.id for m in start.taken] == [d1.id] and start.taken[0].folded
    assert [m.id for m in start.history] == [d1.id] and not start.history[0].folded
    assert start.taken[0].as_dict()["display_metadata"] == {"n": 1}
    again = await store.abegin_turn("sess_a")
    assert again.taken == () and again.history[0].folded
    assert writes(store) == before + 1


async def test_racing_async_turns_fold_each_row_once(store_a: SessionStore) -> None:
    store = store_a
    for round_ in range(5):
        ids = {delivery(store, "sess_a", round_ * 10 + i).id for i in range(3)}
        starts = await asyncio.gather(*(store.abegin_turn("sess_a") for _ in range(8)))
        taken = [m.id for s in starts for m in s.taken]
        assert sorted(taken) == sorted(ids)  # every row once, none twice
        olds = await asyncio.gather(*(store.abegin_turn("sess_a") for _ in range(4)))
        assert all(s.taken == () for s in olds)


def test_racing_threads_fold_each_row_once(store_a: SessionStore) -> None:
    store = store_a
    ids = {delivery(store, "sess_a", n).id for n in range(40)}
    taken: list[int] = []
    lock = threading.Lock()
    gate = threading.Barrier(8)

    def turn() -> None:
        # Each thread its own event loop, as each server process has.
        gate.wait()
        got = begin(store, "sess_a").taken
        with lock:
            taken.extend(m.id for m in got)

    threads = [threading.Thread(target=turn) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(taken) == sorted(ids)


def test_delete_of_a_malformed_id_records_nothing(store: SessionStore) -> None:
    assert store.delete_session("not an id") is False
    assert store.get_session("not an id") is None
    with pytest.raises(ValueError):
        run_sync(store.abegin_turn("not an id"))  # no turn, so no record, can have it
