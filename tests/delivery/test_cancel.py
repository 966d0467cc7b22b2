"""The cancel and progress rules of the ledger, on every backend (SQLite, memory, PostgreSQL):
one compare-and-set decides between a cancel and a result, a second cancel says the unit had
already finished, a dropped row is cancelled without a notice, and progress is written only
on a running row, read back as ``BackgroundUnit``s."""

from __future__ import annotations

from typing import Any

from delivery.cancel import ALREADY_FINISHED, CANCELLED, NOT_FOUND, Progress, active_units
from delivery.ledger import Ledger
from tests.delivery._support import FakeClock


def create(
    ledger: Ledger, row_id: str, *, kind: str = "delegation", state: str = "running"
) -> None:
    request: dict[str, Any] = {"type": "async_delegation", "delegation_id": row_id, "goal": "g"}
    if kind == "process":
        request = {"type": "completion", "delivery_id": row_id, "command": "sleep 9"}
    ledger.create(row_id, kind=kind, state=state, session_key="s1", goal="g", request=request)


def test_cancel_settles_a_running_row_with_a_notice_once(ledger: Ledger, clock: FakeClock) -> None:
    create(ledger, "deleg_a")
    clock.advance(5)
    outcome = ledger.cancel("deleg_a", by="the web UI")
    assert outcome.status == CANCELLED and outcome.kind == "delegation"
    assert outcome.event is not None and outcome.event["status"] == "cancelled"
    assert outcome.event["cancelled_by"] == "the web UI"
    assert outcome.event["error"] == "Stopped by the web UI."
    assert outcome.event["duration_seconds"] == 5.0
    row = ledger.get("deleg_a")
    assert row is not None and row.state == "cancelled" and row.delivery_state == "pending"
    assert row.event == outcome.event
    assert [h["action"] for h in ledger.history("deleg_a")] == ["cancel"]
    # the notice is delivered like any completion
    token = ledger.claim("deleg_a", "test")
    assert token and ledger.complete("deleg_a", token)

    again = ledger.cancel("deleg_a", by="the API")
    assert again.status == ALREADY_FINISHED and again.state == "cancelled"
    assert ledger.cancel("deleg_none", by="the API").status == NOT_FOUND


def test_a_result_recorded_first_wins_and_one_after_the_cancel_is_lost(ledger: Ledger) -> None:
    create(ledger, "deleg_r")
    event = {"type": "async_delegation", "delegation_id": "deleg_r", "status": "completed"}
    assert ledger.finish("deleg_r", expected="running", state="completed", event=event)
    outcome = ledger.cancel("deleg_r", by="the CLI")
    assert outcome.status == ALREADY_FINISHED and outcome.state == "completed"

    create(ledger, "deleg_c")
    assert ledger.cancel("deleg_c", by="the CLI").status == CANCELLED
    late = {"type": "async_delegation", "delegation_id": "deleg_c", "status": "completed"}
    assert not ledger.finish("deleg_c", expected="running", state="completed", event=late)
    row = ledger.get("deleg_c")
    assert row is not None and row.state == "cancelled" and row.event["cancelled_by"] == "the CLI"


def test_a_queued_unit_and_a_process_are_cancelled_in_their_own_words(ledger: Ledger) -> None:
    create(ledger, "deleg_q", state="queued")
    queued = ledger.cancel("deleg_q", by="the API")
    assert queued.event is not None and queued.event["error"] == (
        "Stopped by the API, before it started."
    )
    create(ledger, "proc_p", kind="process")
    process = ledger.cancel("proc_p", by="the API")
    assert process.event is not None and process.event["type"] == "completion"
    assert process.event["delivery_id"] == process.event["process_id"] == "proc_p"
    assert process.event["exit_code"] is None and process.event["command"] == "sleep 9"


def test_a_dropped_row_is_cancelled_without_a_notice(ledger: Ledger) -> None:
    create(ledger, "proc_quiet", kind="process")
    assert ledger.drop("proc_quiet", "notify_on_complete was off")
    outcome = ledger.cancel("proc_quiet", by="the API")
    assert outcome.status == CANCELLED and outcome.event is None
    row = ledger.get("proc_quiet")
    assert row is not None and row.state == "cancelled" and row.delivery_state == "dropped"


def test_progress_is_written_on_running_rows_only(ledger: Ledger, clock: FakeClock) -> None:
    create(ledger, "deleg_p")
    create(ledger, "deleg_gone")
    assert ledger.cancel("deleg_gone", by="the API").status == CANCELLED
    reports = {
        "deleg_p": Progress.of("running the tool terminal", "one\ntwo\n\n", clock()),
        "deleg_gone": Progress.of("waiting for the model", None, clock()),
    }
    stale = ledger.submit_progress(reports).result()
    assert stale == {"deleg_gone"}  # cancelled elsewhere: its work is to stop
    clock.advance(3)
    [unit] = active_units(ledger.views, clock(), session="s1")
    assert unit.id == "deleg_p" and unit.step == "running the tool terminal"
    assert unit.line == "two" and unit.elapsed_seconds == 3.0
    long_line = Progress.of("x" * 500, "y" * 500, clock())
    assert len(long_line.step or "") == 200 and len(long_line.line or "") == 300
