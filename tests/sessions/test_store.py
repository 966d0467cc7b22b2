"""Conformance of every session backend behind SessionStore: sessions, dedupe, exactly-once folding.

Each test takes the ``store`` fixture, so it runs once per backend in ``BACKENDS``.
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.config import Platform
from gateway.session import (
    SessionGone,
    SessionSource,
    SessionStore,
    SessionStoreError,
    SessionTaken,
    build_session_key,
    is_valid_session_id,
)
from tests.sessions._support import (
    append_turn,
    delivery,
    make_session,
    race,
    state_of,
    take_unfolded,
)

# ----------------------------------------------------------------- sessions


def test_session_id_validation() -> None:
    assert is_valid_session_id("sess_abc")
    assert is_valid_session_id("a.b:c-d_e")
    assert is_valid_session_id("x" * 128)
    for bad in ["", "x" * 129, "a b", "a/b", "a\nb", "é", None, 5, "abc\n"]:
        assert not is_valid_session_id(bad), bad


def test_create_get_list_delete(store: SessionStore) -> None:
    src = SessionSource(Platform.TELEGRAM, chat_id="c1", chat_type="group")
    a = make_session(store, source=src, title="first")
    assert a.id.startswith("sess_") and is_valid_session_id(a.id)
    assert a.source == src.to_dict()
    assert a.session_key == build_session_key(src)
    assert store.get_session(a.id) == a

    b = make_session(store, "api-123")
    assert b.source is None and b.session_key is None and b.title is None
    store.append_message("api-123", "user", "bump")  # most recently active first
    assert [s.id for s in store.list_sessions()] == ["api-123", a.id]
    assert [s.id for s in store.list_sessions(limit=1, offset=1)] == [a.id]

    assert store.delete_session(a.id) is True
    assert store.delete_session(a.id) is False
    assert store.get_session(a.id) is None


def test_create_existing_returns_existing_unchanged(store: SessionStore) -> None:
    first = make_session(store, "same", title="original")
    again = make_session(store, "same", title="other")
    assert again == first


def test_create_rejects_bad_id_and_source(store: SessionStore) -> None:
    with pytest.raises(ValueError):
        make_session(store, "has space")
    with pytest.raises(TypeError):
        make_session(store, "ok", source={"platform": "telegram"})  # type: ignore[arg-type]


def test_list_rejects_negative(store: SessionStore) -> None:
    with pytest.raises(ValueError):
        store.list_sessions(limit=-1)


def test_delete_takes_the_transcript(store: SessionStore) -> None:
    make_session(store, "s")
    store.append_message("s", "user", "hi")
    delivery(store, "s", 1)
    assert store.delete_session("s") is True
    make_session(store, "s")  # an explicit creation starts afresh
    assert store.messages("s") == []
    assert take_unfolded(store, "s") == []


def test_closed_store_raises(store: SessionStore) -> None:
    store.close()
    store.close()  # idempotent
    with pytest.raises(SessionStoreError, match="closed"):
        store.get_session("x")
    with pytest.raises(SessionStoreError, match="closed"):
        make_session(store, "x")


# ----------------------------------------------------------------- messages


def test_append_and_read_messages(store: SessionStore) -> None:
    make_session(store, "s")
    m1 = store.append_message("s", "user", "hello")
    m2 = store.append_message("s", "assistant", "hi there")
    m3 = delivery(store, "s", 1)
    assert set(m1.as_dict()) == {
        "id",
        "role",
        "content",
        "created_at",
        "display_kind",
        "display_metadata",
        "folded",
        "seen",
        "archived",
        "summary_id",
    }
    assert m1.display_kind is None and m1.display_metadata is None
    assert m3.display_metadata == {"n": 1} and m3.folded is False
    assert [m.id for m in store.messages("s")] == [m1.id, m2.id, m3.id]
    assert [m.id for m in store.messages("s", after_id=m1.id)] == [m2.id, m3.id]
    assert [m.id for m in store.messages("s", limit=1)] == [m1.id]
    assert store.messages("s", after_id=m3.id) == []


def test_unknown_session_raises_key_error(store: SessionStore) -> None:
    with pytest.raises(SessionGone):
        store.append_message("ghost", "user", "x")
    with pytest.raises(SessionGone):
        store.messages("ghost")
    with pytest.raises(SessionGone):
        take_unfolded(store, "ghost")


def test_append_validates_arguments(store: SessionStore) -> None:
    make_session(store, "s")
    with pytest.raises(ValueError):
        store.append_message("s", "", "x")
    with pytest.raises(TypeError):
        store.append_message("s", "user", None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        store.append_message("s", "user", "x", display_metadata={"bad": object()})
    assert store.messages("s") == []


def test_dedupe_key_never_appends_twice(store: SessionStore) -> None:
    make_session(store, "s")
    make_session(store, "t")
    first = delivery(store, "s", 7)
    again = store.append_message("s", "system", "different text", dedupe_key="deleg:7")
    assert again == first
    assert len(store.messages("s")) == 1
    # The key is unique per session, not globally.
    other = delivery(store, "t", 7)
    assert other.id != first.id
    # No key means no dedupe.
    store.append_message("s", "user", "same")
    store.append_message("s", "user", "same")
    assert len(store.messages("s")) == 3


def test_message_ids_not_reused_after_delete(store: SessionStore) -> None:
    make_session(store, "s")
    last = store.append_message("s", "user", "x")
    store.delete_session("s")
    make_session(store, "s")
    assert store.append_message("s", "user", "y").id > last.id


# ----------------------------------------------------------------- folding


def test_take_unfolded_deliveries_exactly_once(store: SessionStore) -> None:
    make_session(store, "s")
    store.append_message("s", "user", "plain message is not a delivery")
    d1 = delivery(store, "s", 1)
    d2 = delivery(store, "s", 2)
    taken = take_unfolded(store, "s")
    assert [m["id"] for m in taken] == [d1.id, d2.id]
    assert all(m["folded"] for m in taken)
    assert take_unfolded(store, "s") == []
    d3 = delivery(store, "s", 3)
    assert [m["id"] for m in take_unfolded(store, "s")] == [d3.id]
    # The transcript still shows them, now marked folded.
    folded = {m.id: m.folded for m in store.messages("s")}
    assert folded[d1.id] and folded[d3.id]
    # A redelivery of an already folded completion does not resurrect it.
    delivery(store, "s", 1)
    assert take_unfolded(store, "s") == []


def test_take_unfolded_races_on_one_store(store: SessionStore) -> None:
    make_session(store, "s")
    taken = race([store], "s", total=150, threads=5)
    assert len(taken) == len(set(taken)) == 150


async def test_usable_from_async_via_to_thread(store: SessionStore) -> None:
    await store.acreate_session("s")
    await asyncio.gather(
        *(asyncio.to_thread(store.append_message, "s", "user", str(i)) for i in range(20))
    )
    assert len(await asyncio.to_thread(store.messages, "s")) == 20


async def test_sessions_by_prefix_are_the_opening_and_its_forks(store: SessionStore) -> None:
    for sid in ("api_abc", "api_abc_1", "api_abcd", "api_ab", "api_abc_2"):
        make_session(store, sid)
    store.append_message("api_abc_1", "user", "hello")
    store.delete_session("api_abc_2")
    found = await store.asessions_by_prefix("api_abc")
    assert [sid for sid, _ in found.transcripts] == ["api_abc", "api_abc_1"]
    assert [m.content for m in dict(found.transcripts)["api_abc_1"]] == ["hello"]
    assert not found.prefix_deleted
    none = await store.asessions_by_prefix("api_none")
    assert none.transcripts == () and not none.prefix_deleted


async def test_sessions_by_prefix_tell_a_deleted_opening_from_a_new_one(
    store: SessionStore,
) -> None:
    make_session(store, "api_gone")
    make_session(store, "api_gone_1")
    store.delete_session("api_gone")
    found = await store.asessions_by_prefix("api_gone")
    assert [sid for sid, _ in found.transcripts] == ["api_gone_1"]
    assert found.prefix_deleted
    # Deleted before its first write ever landed: still a tombstone, not a new id.
    store.delete_session("api_never")
    assert (await store.asessions_by_prefix("api_never")).prefix_deleted
    make_session(store, "api_gone")  # created again: live, no longer deleted
    again = await store.asessions_by_prefix("api_gone")
    assert sorted(sid for sid, _ in again.transcripts) == ["api_gone", "api_gone_1"]
    assert not again.prefix_deleted


async def test_an_exclusive_creation_never_joins_a_session_that_exists(
    store: SessionStore,
) -> None:
    source = SessionSource(platform=Platform.API_SERVER, chat_id="api_x")
    turn = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    append_turn(store, "api_x", turn, create=source, exclusive=True)  # new: created
    with pytest.raises(SessionTaken):
        make_session(store, "api_x", source=source, exclusive=True)
    with pytest.raises(SessionTaken):
        await store.acreate_session("api_x", source=source, exclusive=True)
    other = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "other"}]
    with pytest.raises(SessionTaken):
        append_turn(store, "api_x", other, create=source, exclusive=True)
    with pytest.raises(SessionTaken):
        await store.aappend_turn("api_x", other, create=source, exclusive=True)
    assert [m.content for m in store.messages("api_x")] == ["hi", "hello"]
    # Not exclusive: the existing session is the one to write into.
    assert make_session(store, "api_x", source=source).id == "api_x"
    await store.aappend_turn("api_x", other, create=source)
    assert len(store.messages("api_x")) == 4
    # An exclusive creation of an id that is new, or deleted, still creates it.
    await store.acreate_session("api_y", source=source, exclusive=True)
    assert store.delete_session("api_y")
    make_session(store, "api_y", source=source, exclusive=True)
    assert state_of(store, "api_y") == "live"


async def test_a_first_turn_creates_its_session_at_its_time_and_later_turns_touch_it(
    store: SessionStore,
) -> None:
    # SQLite writes a new conversation in one statement and skips the touch that would
    # change nothing; a later turn of it, or of another session, must still be a touch.
    source = SessionSource(platform=Platform.API_SERVER, chat_id="api_t")
    turn = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    await store.aappend_turn("api_t", turn, create=source, exclusive=True, title="hi")
    first = store.get_session("api_t")
    assert first is not None and first.title == "hi" and first.source is not None
    assert first.created_at == first.updated_at
    await store.aappend_turn("api_u", turn, create=source)
    await asyncio.sleep(0.01)
    await store.aappend_turn("api_t", turn, create=source)  # exists: appended, touched
    again = store.get_session("api_t")
    assert again is not None and again.created_at == first.created_at
    assert again.updated_at > first.updated_at
    assert [s.id for s in store.list_sessions()][:2] == ["api_t", "api_u"]
    assert [m.content for m in store.messages("api_t")] == ["hi", "hello", "hi", "hello"]


# ----------------------------------------------------------------- titles


async def test_a_session_is_titled_once_unless_renamed(store: SessionStore) -> None:
    sid = make_session(store).id
    assert await store.aset_title(sid, "first words", if_untitled=True) is True
    assert await store.aset_title(sid, "second words", if_untitled=True) is False
    assert store.get_session(sid).title == "first words"
    assert await store.aset_title(sid, "renamed") is True
    assert store.get_session(sid).title == "renamed"
    store.delete_session(sid)
    assert await store.aset_title(sid, "ghost") is False  # a deleted session stays deleted
    assert store.get_session(sid) is None


@pytest.mark.parametrize("title", ["", "   ", "x" * 201])
async def test_a_title_is_text_of_bounded_length(store: SessionStore, title: str) -> None:
    sid = make_session(store).id
    with pytest.raises(ValueError):
        await store.aset_title(sid, title)
    assert store.get_session(sid).title is None


def test_latest_messages_pages_the_transcript_from_its_end(store: SessionStore) -> None:
    make_session(store, "sess_page")
    ids = [store.append_message("sess_page", "user", f"m{i}").id for i in range(7)]
    newest = store.latest_messages("sess_page", limit=3)
    assert [m.content for m in newest] == ["m4", "m5", "m6"]
    older = store.latest_messages("sess_page", before_id=newest[0].id, limit=3)
    assert [m.content for m in older] == ["m1", "m2", "m3"]
    oldest = store.latest_messages("sess_page", before_id=older[0].id, limit=3)
    assert [m.id for m in oldest] == ids[:1]
    assert store.latest_messages("sess_page", before_id=ids[0], limit=3) == []
    assert store.latest_messages("sess_page", limit=0) == []
    with pytest.raises(SessionGone):
        store.latest_messages("sess_missing")
