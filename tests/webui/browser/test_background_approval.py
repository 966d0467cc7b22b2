"""A background sub-agent's command asks for approval in the web UI after its turn ended: the
card waits for the click (in a tab opened later too), the session stays free meanwhile,
Approve runs the command and the sub-agent's result comes home once; unanswered, the card
says it expired, also after a reload."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from playwright.sync_api import expect

from agent.markers import SUBAGENT_MARKER
from tests.webui.browser.test_wakeup_flow import create_session, finished_reply

WAKE_REPLY = "The background task reported back."


class ScriptedModel:
    """An OpenAI-compatible endpoint answering from two scripts: the conversation's calls
    and the sub-agent's (its system message carries the marker), streamed when asked so."""

    def __init__(self, main: list[dict[str, Any]], sub: list[dict[str, Any]]) -> None:
        self.scripts = {"main": list(main), "sub": list(sub)}
        self.seen: dict[str, list[dict[str, Any]]] = {"main": [], "sub": []}
        lock = threading.Lock()
        model = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                first = body["messages"][0]
                who = "sub" if SUBAGENT_MARKER in str(first.get("content")) else "main"
                with lock:
                    model.seen[who].append(body)
                    script = model.scripts[who]
                    answer = script.pop(0) if script else {"content": "nothing more"}
                if body.get("stream"):
                    self._stream(answer)
                else:
                    self._json(answer)

            def _message(self, answer: dict[str, Any]) -> dict[str, Any]:
                message: dict[str, Any] = {"role": "assistant", "content": answer.get("content")}
                if answer.get("tool_calls"):
                    message["tool_calls"] = answer["tool_calls"]
                return message

            def _json(self, answer: dict[str, Any]) -> None:
                finish = "tool_calls" if answer.get("tool_calls") else "stop"
                raw = json.dumps(
                    {
                        "id": "c1",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": "scripted",
                        "choices": [
                            {"index": 0, "message": self._message(answer), "finish_reason": finish}
                        ],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def _stream(self, answer: dict[str, Any]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                delta: dict[str, Any] = {
                    "role": "assistant",
                    "content": answer.get("content") or "",
                }
                if answer.get("tool_calls"):
                    delta["tool_calls"] = [
                        {"index": i, **call} for i, call in enumerate(answer["tool_calls"])
                    ]
                finish = "tool_calls" if answer.get("tool_calls") else "stop"
                for piece, end in ((delta, None), ({}, finish)):
                    chunk = {
                        "id": "c1",
                        "object": "chat.completion.chunk",
                        "created": int(time.time()),
                        "model": "scripted",
                        "choices": [{"index": 0, "delta": piece, "finish_reason": end}],
                    }
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def env(self) -> dict[str, str]:
        return {
            "REVEILLE_PROVIDER": "openai",
            "OPENAI_BASE_URL": self.url,
            "OPENAI_API_KEY": "sk-test",
            "REVEILLE_MODEL": "scripted",
            "REVEILLE_SHELL_ENABLED": "1",
        }

    def tool_results(self) -> list[dict[str, Any]]:
        last = self.seen["sub"][-1]["messages"]
        return [json.loads(m["content"]) for m in last if m["role"] == "tool"]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


@pytest.fixture
def delegating() -> Iterator[Any]:
    models: list[ScriptedModel] = []

    def make(command: str, summary: str) -> ScriptedModel:
        model = ScriptedModel(
            main=[
                {"tool_calls": [_call("m1", "delegate_task", goal="run it", background=True)]},
                {"content": "Started in the background."},
                {"content": WAKE_REPLY},
            ],
            sub=[{"tool_calls": [_call("s1", "terminal", command=command)]}, {"content": summary}],
        )
        models.append(model)
        return model

    yield make
    for model in models:
        model.close()


def test_a_background_command_waits_for_the_click_and_comes_home_once(
    start_server, new_tab, shots, delegating
) -> None:
    model = delegating("echo '<b>web-output</b>'", "It printed web-output.")
    server = start_server(env=model.env)
    tab = new_tab(server.url)
    page = tab.open("/")
    session_id = create_session(page, "run it in the background")
    expect(finished_reply(page, 0)).to_contain_text("Started in the background.")
    card = page.get_by_test_id("approval-card")
    expect(card).to_have_count(1)
    expect(card).to_have_attribute("data-background", "true")
    expect(card).to_have_attribute("data-status", "pending")
    expect(card).to_contain_text("A background task wants to run a command")
    expect(card).to_contain_text("echo '<b>web-output</b>'")
    expect(card.locator("b")).to_have_count(0)  # shown as text, never as markup
    # The turn ended and the session is free: the approval holds nothing.
    detail = server.get(f"/api/sessions/{session_id}")
    assert detail["active_stream"] is None and detail["pending_approval"] is None
    (waiting,) = detail["unit_approvals"]
    assert waiting["status"] == "pending" and waiting["unit_id"].startswith("deleg_")
    shots(page, "background-approval-pending")

    # A tab opened later shows the same card, and the click there decides it.
    later = new_tab(server.url)
    other = later.open(f"/?session={session_id}")
    other_card = other.get_by_test_id("approval-card")
    expect(other_card).to_have_attribute("data-status", "pending")
    other_card.get_by_test_id("approve").click()
    expect(other_card).to_have_attribute("data-status", "approved")
    expect(card).to_have_attribute("data-status", "approved")  # the first tab hears of it

    # The command ran; the sub-agent's result came home as one wake-up.
    wake = page.locator("[data-testid=message][data-wakeup=true]")
    expect(wake).to_have_count(1, timeout=30000)
    expect(wake).to_contain_text(WAKE_REPLY)
    (result,) = model.tool_results()
    assert result["output"] == "<b>web-output</b>\n"
    wakeups = [m for m in model.seen["main"] if "It printed web-output." in json.dumps(m)]
    assert len(wakeups) == 1
    time.sleep(1.0)
    expect(wake).to_have_count(1)
    shots(page, "background-approval-approved")
    assert "approved by the web UI" in server.output()
    assert not tab.errors and not later.errors, tab.errors + later.errors


def test_an_unanswered_background_command_expires_on_its_card(
    start_server, new_tab, shots, delegating
) -> None:
    model = delegating("echo never", "Nobody answered.")
    server = start_server(env={**model.env, "REVEILLE_SHELL_APPROVAL_TIMEOUT": "2"})
    tab = new_tab(server.url)
    page = tab.open("/")
    session_id = create_session(page, "run it in the background")
    card = page.get_by_test_id("approval-card")
    expect(card).to_have_attribute("data-status", "pending")
    expect(card).to_have_attribute("data-status", "expired", timeout=30000)
    expect(card).to_contain_text("nobody answered")
    expect(card.get_by_test_id("approve")).to_have_count(0)
    server.wait_for(lambda: model.tool_results(), "the sub-agent told of the expiry")
    assert model.tool_results()[0]["expired"] is True
    # After a reload the one notice is still there, as the expired card.
    page.reload()
    page.wait_for_selector("#app[data-ready=true]")
    expect(page.get_by_test_id("approval-card")).to_have_count(1)
    expect(page.get_by_test_id("approval-card")).to_have_attribute("data-status", "expired")
    detail = server.get(f"/api/sessions/{session_id}")
    assert detail["unit_approvals"] == []
    shots(page, "background-approval-expired")
    assert not tab.errors, tab.errors
