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
        assert "Re-delivered" in format_wake_text({**evt, "restored": True}, now=0)
    # Only ``restored`` exactly True is the ledger's mark; any other value is the event's.
    assert "Re-delivered" not in format_wake_text({**DELEG, "restored": 1}, now=0)


def test_a_first_offer_by_another_process_is_not_said_to_be_delivered_again() -> None:
    """A cancel made from the CLI writes its notice; a server offers it first (marked
    restored, so no new session adopts it), but nothing was delivered before."""
    for evt in (DELEG, PROC, {"type": "watch_match", "pattern": "ERROR"}):
        first = {**evt, "restored": True, "_restored": True, "_first_offer": True}
        assert "Re-delivered" not in format_wake_text(first, now=0)


def test_generic_text_hides_ledger_bookkeeping() -> None:
    text = format_wake_text(
        {"type": "watch_match", "pattern": "ERROR", "_restored": True, "_reoffer_reason": "x"}
    )
    assert "_reoffer_reason" not in text and "pattern: ERROR" in text


def test_demo_model_reads_marked_texts() -> None:
    (line,) = summarise_completion_text(format_wake_text(DELEG, now=0))
    assert "summarise the report" in line and "It is short." in line


def test_the_last_line_carries_the_display_metadata() -> None:
    from agent.markers import WAKE_DATA_MARKER, read_wake_data
    from delivery.event_display import display_metadata

    for evt in (DELEG, PROC, {"type": "watch_match", "pattern": "ERROR"}):
        text = format_wake_text(evt, now=0)
        assert text.rstrip("\n").splitlines()[-1].startswith(WAKE_DATA_MARKER + " ")
        assert read_wake_data(text) == [display_metadata(evt)]


def test_the_demo_reads_the_data_not_the_prose() -> None:
    # A context that looks like a status line, and a summary the prose reader would split:
    # the structured line decides.
    evt = {**DELEG, "context": "Status: not this", "summary": "Error: part of the summary"}
    (line,) = summarise_completion_text(format_wake_text(evt, now=0))
    assert line == (
        "Background work finished: summarise the report: completed. "
        "Result: Error: part of the summary"
    )


def test_reveille_chat_renders_rows_from_their_metadata() -> None:
    from delivery.event_display import display_metadata
    from reveille.chat import render_message

    row = {
        "role": "system",
        "content": "text the client never parses",
        "display_kind": "async_delegation_complete",
        "display_metadata": display_metadata(DELEG),
    }
    assert render_message(row) == (
        "[background result] Background work finished: summarise the report: completed. "
        "Result: It is short."
    )
    wake = {"role": "user", "content": format_wake_text(PROC, now=0)}
    assert render_message(wake) == (
        "[wake-up] Background work finished: `echo hi`: exit code 0. Result: (no result text)"
    )
