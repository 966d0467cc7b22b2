"""A turn parked on a client tool call across a SIGKILL and restart of `reveille serve`,
with a background sub-agent's result arriving while it waits: after the restart the client
resumes the turn, the result is folded in once, and nothing is lost or doubled."""

from __future__ import annotations

import re
import signal
import time

from gateway.wake import DELEGATION_DISPLAY_KIND
from tests.api_server.serve_support import Server, call, ledger_rows, transcript, wait_until

WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object"}},
}
ASK = 'call client tool get_weather with {"city": "Oslo"}'
BACKGROUND = "in the background: count the stars"


def _post(port: int, messages: list[dict], session_id: str | None = None):
    headers = {"X-Hermes-Session-Id": session_id} if session_id else {}
    body = {"model": "reveille-demo", "messages": messages, "tools": [WEATHER]}
    return call(port, "POST", "/v1/chat/completions", body, headers)


def test_a_parked_call_survives_a_sigkill_and_background_results_wait_behind_it(
    tmp_path,
) -> None:
    # The sub-agent takes a few seconds: its result arrives while the turn is parked.
    first = Server(tmp_path, demo_delay=3.0)
    try:
        status, headers, data = _post(first.port, [{"role": "user", "content": BACKGROUND}])
        assert status == 200, data
        session_id = headers["X-Hermes-Session-Id"]
        started = data["choices"][0]["message"]["content"]
        history = [
            {"role": "user", "content": BACKGROUND},
            {"role": "assistant", "content": started},
            {"role": "user", "content": ASK},
        ]
        status, _, data = _post(first.port, history, session_id)
        assert status == 200, data
        choice = data["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        calls = choice["message"]["tool_calls"]
        assert calls[0]["function"]["name"] == "get_weather"

        def result_arrived() -> bool:
            rows = transcript(first.port, session_id)
            return any(m["display_kind"] == DELEGATION_DISPLAY_KIND for m in rows)

        wait_until(result_arrived)
        # Still parked: a new message is refused, nothing folded the result.
        status, _, data = _post(
            first.port, [*history[:2], {"role": "user", "content": "hello?"}], session_id
        )
        assert status == 409 and data["error"]["code"] == "tool_calls_pending"
    finally:
        first.stop(signal.SIGKILL)

    second = Server(tmp_path)
    try:
        resumed = [
            *history,
            {"role": "assistant", "content": choice["message"]["content"], "tool_calls": calls},
            {"role": "tool", "tool_call_id": calls[0]["id"], "content": "snow, -3 C"},
        ]
        status, _, data = _post(second.port, resumed, session_id)
        assert status == 200, data
        answer = data["choices"][0]["message"]["content"]
        assert data["choices"][0]["finish_reason"] == "stop"
        assert "snow, -3 C" in answer
        # The same results again: nobody waits for them any more (not answered twice).
        status, _, data = _post(second.port, resumed, session_id)
        assert status == 400 and data["error"]["code"] == "no_pending_tool_calls", data

        rows = transcript(second.port, session_id)
        results = [m for m in rows if m["display_kind"] == DELEGATION_DISPLAY_KIND]
        assert len(results) == 1 and results[0]["folded"]
        replies = [m for m in rows if m["role"] == "assistant" and "snow, -3 C" in m["content"]]
        assert len(replies) == 1
        wait_until(lambda: all(r.delivery_state == "delivered" for r in ledger_rows(tmp_path)))
        assert second.stop() == 0
    finally:
        if second.proc.poll() is None:
            second.proc.kill()
    assert re.search(r"Reveille is listening", "".join(second.lines))


def test_of_two_servers_sharing_the_store_one_ends_a_park_past_its_deadline(tmp_path) -> None:
    """Two `reveille serve` processes on one state, a one-second client timeout: the park
    is ended by a sweep without any request, the agent told once, not once per server."""
    env = {"REVEILLE_CLIENT_TOOL_TIMEOUT": "1"}
    first = Server(tmp_path, extra_env=env)
    second = Server(tmp_path, extra_env=env)
    try:
        status, headers, data = _post(first.port, [{"role": "user", "content": ASK}])
        assert status == 200 and data["choices"][0]["finish_reason"] == "tool_calls", data
        session_id = headers["X-Hermes-Session-Id"]

        def told() -> list[dict]:
            rows = transcript(second.port, session_id)
            return [
                m
                for m in rows
                if m["role"] == "assistant" and "did not return a result" in m["content"]
            ]

        wait_until(told)
        # A few more passes of both sweeps: nothing is ended twice.
        time.sleep(3.0)
        assert len(told()) == 1
        # The session is free: a new message is answered.
        status, _, data = _post(second.port, [{"role": "user", "content": "and now?"}], session_id)
        assert status == 200 and data["choices"][0]["finish_reason"] == "stop", data
    finally:
        first.stop(signal.SIGKILL)
        second.stop(signal.SIGKILL)
