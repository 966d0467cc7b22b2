"""The web UI's delivery consumer against the real ledger: busy waits, refunds, budgets."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from api import background_process as bp
from api import config as cfg
from api import routes
from tools import async_delegation as ad
from tools.completion_queue import CompletionQueue


class Turns:
    """A stand-in web UI server: answers start_turn with what the test sets."""

    def __init__(self) -> None:
        self.busy: set[str] = set()
        self.answer: dict[str, Any] | None = {"stream_id": "st1", "session_id": "ui-1"}
        self.calls: list[tuple[str, str, str]] = []
        self.called = threading.Event()
        self.queue = CompletionQueue()

    def start_turn(self, session_id: str, text: str, *, source: str) -> dict[str, Any]:
        self.calls.append((session_id, text, source))
        self.called.set()
        return dict(self.answer) if self.answer is not None else None  # type: ignore[return-value]

    def is_busy(self, session_id: str) -> bool:
        return session_id in self.busy


@pytest.fixture
def turns(monkeypatch: pytest.MonkeyPatch, tmp_path) -> Iterator[Turns]:
    monkeypatch.setenv("REVEILLE_HOME", str(tmp_path / "home"))
    ad.reset_runtime()
    queue = CompletionQueue()
    ad.configure_runtime(str(tmp_path / "ledger.db"), completion_queue=queue)
    bound = Turns()
    bound.queue = queue
    routes.bind(bound)
    yield bound
    routes.unbind(bound)
    with cfg.MAPS_LOCK:
        cfg.DEFERRED_PROCESS_WAKEUPS.clear()
        cfg.BG_TASK_COMPLETE_EVENTS_SEEN.clear()
        cfg.PROCESS_SESSION_INDEX.clear()
    ad.reset_runtime()


def _finished(queue: CompletionQueue, origin: str | None = "ui-1") -> dict[str, Any]:
    """A real delegation, run to completion; its completion event."""
    res = ad.dispatch_async_delegation(
        goal="count",
        runner=lambda: {"status": "completed", "summary": "42"},
        session_key="webui:ui-1",
        origin_ui_session_id=origin,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        evt = queue.get(timeout=10)
        if evt.get("delegation_id") == res["delegation_id"]:
            return evt
    raise AssertionError("no completion")


def _row(evt: dict[str, Any]) -> dict[str, Any]:
    row = ad.get_durable_delegation(evt["delegation_id"])
    assert row is not None
    return row


def _settled(evt: dict[str, Any], state: str, timeout: float = 5.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = _row(evt)
        if row["delivery_state"] == state and (state == "delivered" or not row.get("claim_token")):
            return row
        time.sleep(0.01)
    raise AssertionError(f"row stayed {_row(evt)['delivery_state']}")


def test_an_accepted_wake_up_is_acknowledged(turns: Turns) -> None:
    evt = _finished(turns.queue)
    assert bp.handle_completion(evt, "42 files", process_registry=None) == "started"
    row = _settled(evt, "delivered")
    assert turns.calls == [("ui-1", "42 files", "process_wakeup")]
    assert row["delivery_attempts"] == 1


def test_a_busy_session_waits_without_a_claim(turns: Turns) -> None:
    turns.busy.add("ui-1")
    evt = _finished(turns.queue)
    assert bp.handle_completion(evt, "t", process_registry=None) == "deferred"
    row = _row(evt)
    assert row["delivery_state"] == "pending" and row["delivery_attempts"] == 0
    assert not row.get("claim_token")
    assert evt["delegation_id"] in cfg.DEFERRED_PROCESS_WAKEUPS["ui-1"]
    assert turns.calls == []


@pytest.mark.parametrize(
    "answer",
    [
        {
            "_status": 409,
            "error": "runtime changed",
            "type": "agent_runtime_stale",
            "retryable": True,
        },
        {"_status": 409, "error": "busy", "active_stream_id": "s9"},
    ],
)
def test_a_transient_refusal_refunds_the_attempt(turns: Turns, answer: dict[str, Any]) -> None:
    turns.answer = answer
    evt = _finished(turns.queue)
    bp.handle_completion(evt, "t", process_registry=None)
    row = _settled(evt, "pending")
    assert row["delivery_attempts"] == 0  # refunded on the real ledger


def test_a_hard_refusal_spends_one_attempt(turns: Turns) -> None:
    turns.answer = {"_status": 404, "error": "Session not found"}
    evt = _finished(turns.queue)
    bp.handle_completion(evt, "t", process_registry=None)
    row = _settled(evt, "pending")
    assert row["delivery_attempts"] == 1


def test_work_of_another_surface_is_not_touched(turns: Turns) -> None:
    evt = _finished(turns.queue, origin=None)
    assert bp.handle_completion(evt, "t", process_registry=None) == "foreign"
    assert _row(evt)["delivery_attempts"] == 0


def test_the_index_routes_work_without_an_origin_field(turns: Turns) -> None:
    evt = _finished(turns.queue, origin=None)
    with cfg.MAPS_LOCK:
        cfg.PROCESS_SESSION_INDEX[evt["delegation_id"]] = "ui-7"
    assert bp.handle_completion(evt, "t", process_registry=None) == "started"
    _settled(evt, "delivered")
    assert turns.calls[0][0] == "ui-7"


def test_without_a_web_ui_the_refusal_is_retryable() -> None:
    answer = routes.start_session_turn("ui-1", "hello")
    assert answer["_status"] == 503 and answer["retryable"] is True
    assert routes.start_session_turn("ui-1", "  ")["_status"] == 400
    assert bp.classify_turn_answer(answer).retryable
