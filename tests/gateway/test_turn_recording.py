"""The rows a finished turn adds to its transcript (``gateway.turns.recording.turn_rows``)."""

from __future__ import annotations

from types import SimpleNamespace

from gateway.turns.client_calls import ParkedCalls
from gateway.turns.recording import turn_rows
from gateway.turns.requests import TurnRequest

USER = {"role": "user", "content": "hello"}
REPLY = SimpleNamespace(content="hi there")


def test_a_turn_stores_its_user_message_and_its_reply() -> None:
    rows = turn_rows(TurnRequest("s1", [USER]), USER, REPLY)
    assert rows == [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi there"},
    ]


def test_an_idempotency_key_marks_both_rows_and_a_park_rides_on_the_reply() -> None:
    park = {"client_calls": ["call_1"]}
    rows = turn_rows(TurnRequest("s1", [USER], idempotency_key="k1"), USER, REPLY, park=park)
    assert [r["dedupe_key"] for r in rows] == ["idem:k1:user", "idem:k1:assistant"]
    assert rows[1]["display_metadata"] == park and "display_metadata" not in rows[0]


def test_a_resumed_turn_stores_only_its_reply_once_per_park() -> None:
    resumed = ParkedCalls(row_id=41, calls=(), steps=(), deadline=0.0)
    rows = turn_rows(TurnRequest("s1", [USER], idempotency_key="k2"), USER, REPLY, resumed=resumed)
    assert rows == [{"role": "assistant", "content": "hi there", "dedupe_key": "resumed:41"}]


def test_a_wake_up_row_carries_its_wake_metadata_not_the_surfaces() -> None:
    request = TurnRequest("s1", [USER], wakeup=True, user_metadata={"images": ["x"]})
    user_row = turn_rows(request, USER, SimpleNamespace(content=None))[0]
    assert "images" not in user_row["display_metadata"]
    assert turn_rows(request, USER, SimpleNamespace(content=None))[1]["content"] == ""


def test_a_surfaces_metadata_is_copied_not_shared() -> None:
    metadata = {"images": ["x"]}
    user_row = turn_rows(TurnRequest("s1", [USER], user_metadata=metadata), USER, REPLY)[0]
    assert user_row["display_metadata"] == metadata and user_row["display_metadata"] is not metadata
