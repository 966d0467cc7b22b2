"""SessionStore additions for the API server: atomic turns and durable idempotency keys."""

from __future__ import annotations

import pytest

from gateway.session import SessionGone, SessionStore


@pytest.fixture
def store(tmp_path):
    with SessionStore(tmp_path / "s.db") as s:
        s.create_session("sess_a")
        yield s


def test_append_turn_records_messages_and_response_together(store) -> None:
    rows = store.append_turn(
        "sess_a",
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
        idempotency_key="k1",
        response={"id": "chatcmpl-1"},
    )
    assert [r["role"] for r in rows] == ["user", "assistant"]
    row = store.get_idempotent("k1")
    assert row["state"] == "done" and row["response"] == {"id": "chatcmpl-1"}
    assert row["session_id"] == "sess_a"


def test_append_turn_to_unknown_session_writes_nothing(store) -> None:
    with pytest.raises(SessionGone):
        store.append_turn(
            "sess_gone", [{"role": "user", "content": "x"}], idempotency_key="k", response={}
        )
    assert store.get_idempotent("k") is None


def test_append_turn_dedupes_by_key(store) -> None:
    turn = [{"role": "user", "content": "x", "dedupe_key": "idem:k:user"}]
    store.append_turn("sess_a", turn)
    store.append_turn("sess_a", turn)
    assert len(store.messages("sess_a")) == 1


def test_claim_wait_takeover_and_release(store) -> None:
    first = store.claim_idempotent("k", "p:1:a", session_id="sess_a")
    assert first["claimed"] and first["state"] == "running"
    other = store.claim_idempotent("k", "p:1:b")
    assert not other["claimed"] and other["state"] == "running"
    taken = store.claim_idempotent("k", "q:2:c", takeover=lambda owner: owner.startswith("p:"))
    assert taken["claimed"] and taken["owner"] == "q:2:c"
    assert not store.release_idempotent("k", "p:1:a")  # not the holder any more
    assert store.release_idempotent("k", "q:2:c")
    assert store.get_idempotent("k") is None
    store.claim_idempotent("k", "r:3:d")
    store.put_idempotent("k", {"id": "done"}, session_id="sess_a")
    done = store.claim_idempotent("k", "s:4:e", takeover=lambda owner: True)
    assert not done["claimed"] and done["response"] == {"id": "done"}


def test_find_session_by_key(tmp_path) -> None:
    from gateway.config import Platform
    from gateway.session import SessionSource, build_session_key

    with SessionStore(tmp_path / "k.db") as s:
        source = SessionSource(platform=Platform.API_SERVER, chat_id="sess_k")
        s.create_session("sess_k", source=source)
        assert s.find_session_by_key(build_session_key(source))["id"] == "sess_k"
        assert s.find_session_by_key("agent:main:nothing") is None
