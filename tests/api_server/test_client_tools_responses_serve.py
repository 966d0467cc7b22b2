"""A Responses turn parked on a client tool call across a SIGKILL and restart of
`reveille serve`, a background sub-agent's result arriving while it waits: after the
restart the client resumes it with ``function_call_output`` and ``previous_response_id``,
the result is folded in once, and nothing is lost or doubled (the chat path's twin is
``test_client_tools_serve``)."""

from __future__ import annotations

import re
import signal
from typing import Any

from gateway.wake import DELEGATION_DISPLAY_KIND
from tests.api_server.serve_support import Server, call, ledger_rows, transcript, wait_until

WEATHER = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
ASK = 'call client tool get_weather with {"city": "Oslo"}'
BACKGROUND = "in the background: count the stars"


def _respond(port: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    status, _, data = call(
        port, "POST", "/v1/responses", {"model": "reveille-demo", "tools": [WEATHER], **body}
    )
    return status, data


def _session_of(port: int) -> str:
    status, _, data = call(port, "GET", "/api/sessions")
    assert status == 200 and len(data["data"]) == 1, data
    return str(data["data"][0]["id"])


def test_a_parked_response_survives_a_sigkill_and_is_resumed_once(tmp_path) -> None:
    # The sub-agent takes a few seconds: its result arrives while the turn is parked.
    first = Server(tmp_path, demo_delay=3.0)
    try:
        status, started = _respond(first.port, {"input": BACKGROUND})
        assert status == 200 and started["status"] == "completed", started
        status, parked = _respond(first.port, {"input": ASK, "previous_response_id": started["id"]})
        assert status == 200, parked
        calls = [item for item in parked["output"] if item["type"] == "function_call"]
        assert [c["name"] for c in calls] == ["get_weather"]
        session_id = _session_of(first.port)

        def result_arrived() -> bool:
            rows = transcript(first.port, session_id)
            return any(m["display_kind"] == DELEGATION_DISPLAY_KIND for m in rows)

        wait_until(result_arrived)
        # Still parked: a new message is refused, nothing folded the result.
        status, data = _respond(
            first.port, {"input": "hello?", "previous_response_id": parked["id"]}
        )
        assert status == 409 and data["error"]["code"] == "tool_calls_pending", data
    finally:
        first.stop(signal.SIGKILL)

    second = Server(tmp_path)
    try:
        resume = {
            "previous_response_id": parked["id"],
            "input": [
                {"type": "function_call_output", "call_id": calls[0]["call_id"], "output": "snow"}
            ],
        }
        status, data = _respond(second.port, resume)
        assert status == 200 and data["status"] == "completed", data
        assert "snow" in "".join(
            part["text"]
            for item in data["output"]
            if item["type"] == "message"
            for part in item["content"]
        )
        # The same results again: nobody waits for them any more (not answered twice).
        status, again = _respond(second.port, resume)
        assert status == 400 and again["error"]["code"] == "no_pending_tool_calls", again

        rows = transcript(second.port, session_id)
        results = [m for m in rows if m["display_kind"] == DELEGATION_DISPLAY_KIND]
        assert len(results) == 1 and results[0]["folded"]
        replies = [m for m in rows if m["role"] == "assistant" and "snow" in m["content"]]
        assert len(replies) == 1
        wait_until(lambda: all(r.delivery_state == "delivered" for r in ledger_rows(tmp_path)))
        assert second.stop() == 0
    finally:
        if second.proc.poll() is None:
            second.proc.kill()
    assert re.search(r"Reveille is listening", "".join(second.lines))
