"""Two `reveille serve` processes on one state directory; one is SIGKILLed mid-work.

The survivor notices at once (it watches its peer's pidfd) and recovers the dead server's
work as a restart would, without that server ever coming back: a completion the dead one
had delivered but not acknowledged is settled exactly once, and work it was running ends
``unknown`` with a completion that says so, delivered into the session that started it.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from gateway.wake import DELEGATION_DISPLAY_KIND
from tests.api_server.serve_support import (
    Server,
    call,
    chat,
    ledger_rows,
    transcript,
    wait_until,
)

PEERS = re.compile(r"(\d+) other server\(s\) share this state")


class _SlowModel(BaseHTTPRequestHandler):
    """An OpenAI-compatible model that takes a second to answer: turns that start together
    are still running together when they store."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        time.sleep(1.0)
        message = {"role": "assistant", "content": "hello"}
        if body.get("stream"):
            chunks = [
                {"choices": [{"index": 0, "delta": message, "finish_reason": None}]},
                {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            ]
            payload = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
            kind = "text/event-stream"
        else:
            payload = json.dumps(
                {"id": "c", "object": "chat.completion", "created": 0, "model": "slow",
                 "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
            )  # fmt: skip
            kind = "application/json"
        data = payload.encode()
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def slow_model() -> Iterator[dict[str, str]]:
    """The slow model on a loopback port; yields the environment that points a server at it."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _SlowModel)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield {
            "REVEILLE_PROVIDER": "openai",
            "REVEILLE_MODEL": "slow",
            "OPENAI_BASE_URL": f"http://127.0.0.1:{httpd.server_port}/v1",
            "OPENAI_API_KEY": "sk-fake",
        }
    finally:
        httpd.shutdown()
        httpd.server_close()


def _results(port: int, session_id: str) -> list[dict]:
    return [m for m in transcript(port, session_id) if m["display_kind"] == DELEGATION_DISPLAY_KIND]


def test_the_survivor_takes_over_a_killed_peers_work_within_seconds(tmp_path) -> None:
    # The doomed server: its sub-agents take 2 s, and it never acknowledges a delivery.
    doomed = Server(tmp_path, hold_ack=True, demo_delay=2.0)
    survivor = None
    try:
        doomed.wait_for(re.compile("no other server shares this state"))
        survivor = Server(tmp_path)
        assert survivor.wait_for(PEERS).group(1) == "1"
        survivor.wait_for(re.compile(f"pid {doomed.proc.pid}"))

        held_session, _ = chat(doomed.port, "in the background: count the stars")
        doomed.wait_for(re.compile(r"HOLDING-ACK deleg_\w+"))  # delivered, not acknowledged
        running_session, _ = chat(doomed.port, "in the background: map the coast")
        wait_until(lambda: any(r.state == "running" for r in ledger_rows(tmp_path)))

        doomed.stop(signal.SIGKILL)
        killed_at = time.monotonic()

        def settled() -> bool:
            rows = ledger_rows(tmp_path)
            return len(rows) == 2 and all(r.delivery_state == "delivered" for r in rows)

        wait_until(settled, timeout=5)
        took = time.monotonic() - killed_at
        assert took < 5, took

        held = _results(survivor.port, held_session)
        assert len(held) == 1 and "count the stars" in held[0]["content"]
        running = _results(survivor.port, running_session)
        assert len(running) == 1
        assert "map the coast" in running[0]["content"]
        assert "unknown" in running[0]["content"].lower()
        by_state = {r.state for r in ledger_rows(tmp_path)}
        assert by_state == {"completed", "unknown"}
        survivor.wait_for(re.compile("taking over its work"))
        # Nothing is offered again later: still exactly one result each.
        time.sleep(0.5)
        assert len(_results(survivor.port, held_session)) == 1
        assert len(_results(survivor.port, running_session)) == 1
        assert survivor.stop() == 0
    finally:
        for server in (doomed, survivor):
            if server is not None and server.proc.poll() is None:
                server.proc.kill()


def test_alike_first_turns_through_two_servers_never_share_a_session(tmp_path) -> None:
    """Each server reserves the ids of its own running first turns; between servers the
    store refuses the second creation: one conversation gets the opening's id, the other a
    409 with nothing stored, and sent again a session of its own."""
    with slow_model() as env:
        servers = [Server(tmp_path, extra_env=env), Server(tmp_path, extra_env=env)]
        try:
            body = {
                "model": "slow",
                "messages": [{"role": "user", "content": "hello, both of you"}],
            }
            with ThreadPoolExecutor(2) as pool:
                answers = list(
                    pool.map(lambda s: call(s.port, "POST", "/v1/chat/completions", body), servers)
                )
            statuses = sorted(status for status, _, _ in answers)
            assert statuses == [200, 409], answers
            won = next(h for status, h, _ in answers if status == 200)["X-Hermes-Session-Id"]
            lost_at = servers[[status for status, _, _ in answers].index(409)]
            refused = next(data for status, _, data in answers if status == 409)
            assert refused["error"]["code"] == "conversation_conflict"
            assert [m["role"] for m in transcript(servers[0].port, won)] == ["user", "assistant"]
            again, _ = chat(lost_at.port, "hello, both of you", model="slow")
            assert again.startswith(won + "_")
            assert [m["role"] for m in transcript(servers[1].port, again)] == ["user", "assistant"]
        finally:
            for server in servers:
                server.stop()
