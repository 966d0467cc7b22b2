"""format_wake_text: the wake marker opens the text and re-offered events say so."""

from __future__ import annotations

from agent.markers import WAKE_MARKER
from agent.providers.demo_summaries import summarise_completion_text
from gateway.wake import format_wake_text

DELEG = {
    "type": "async_delegation",
    "delegation_id": "deleg_00aa",
    "goal": "summarise the report",
    "status": "completed",
    "summary": "It is short.",
}
PROC = {"type": "completion", "process_id": "proc_1", "command": "echo hi", "exit_code": 0}


def test_marker_opens_the_first_line_of_every_kind() -> None:
    for evt in (DELEG, PROC, {"type": "watch_match", "pattern": "ERROR"}):
        first = format_wake_text(evt, now=0).splitlines()[0]
        assert first.startswith(WAKE_MARKER + " ")


def test_restored_note_follows_the_ledger_field() -> None:
    for evt in (DELEG, PROC, {"type": "watch_match", "pattern": "ERROR"}):
        assert "Re-delivered" not in format_wake_text(evt, now=0)
        assert "Re-delivered" in format_wake_text({**evt, "_restored": True}, now=0)
    # The old spelling is not the ledger's field.
    assert "Re-delivered" not in format_wake_text({**DELEG, "restored": 1}, now=0)


def test_generic_text_hides_ledger_bookkeeping() -> None:
    text = format_wake_text(
        {"type": "watch_match", "pattern": "ERROR", "_restored": True, "_reoffer_reason": "x"}
    )
    assert "_reoffer_reason" not in text and "pattern: ERROR" in text


def test_demo_model_reads_marked_texts() -> None:
    (line,) = summarise_completion_text(format_wake_text(DELEG, now=0))
    assert "summarise the report" in line and "It is short." in line
