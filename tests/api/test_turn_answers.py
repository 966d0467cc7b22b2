"""The typed answers of starting a web UI turn, and the one rule that says which refusals
give a wake-up its attempt back (the seed-pinned dict path reads the same rule)."""

from __future__ import annotations

import pytest

from api import background_process as bp
from api.turn_answers import TurnAccepted, TurnRefused

REFUSALS = [
    (TurnRefused(409, "agent_runtime_stale", "agent_runtime_stale", retryable=True), True),
    (TurnRefused(503, "the session store is unavailable", retryable=True), True),
    (TurnRefused(409, "process_wakeup_paused", "process_wakeup_paused"), True),
    (TurnRefused(409, "busy", "active_stream", active_stream_id="st_1"), True),
    (TurnRefused(404, "Session not found", "session_not_found"), False),
    (TurnRefused(400, "message is required", "message_required"), False),
    (TurnRefused(409, "only web UI sessions", "not_a_webui_session"), False),
    (TurnRefused(500, "the wake-up turn raised"), False),
]


@pytest.mark.parametrize(("refused", "refund"), REFUSALS)
def test_the_typed_rule_and_the_dict_path_agree(refused: TurnRefused, refund: bool) -> None:
    assert refused.refund is refund
    answer = refused.as_dict()
    assert answer["_status"] == refused.status and answer["error"] == refused.error
    assert TurnRefused.from_dict(answer) == refused
    verdict = bp.classify_turn_answer(answer)
    assert not verdict.accepted
    assert (verdict.retryable, verdict.busy) == (refused.refund, refused.busy)


def test_an_accepted_turn_reads_as_accepted_on_the_dict_path() -> None:
    accepted = TurnAccepted("st_1", "sess", "turn_1")
    assert "_status" not in accepted.as_dict()
    assert bp.classify_turn_answer(accepted.as_dict()).accepted
