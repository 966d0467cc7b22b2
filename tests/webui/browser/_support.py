"""What the browser tests share: Debian's chromium, a real `reveille serve` with its web UI,
a slow OpenAI-compatible model for mid-stream tests, screenshots."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[3]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"
API_KEY = "webui-browser-test-key"

# Counts every EventSource the page constructs (the UI must open exactly one per tab), and
# records any dialog an injected script might open.
INIT_SCRIPT = """
(() => {
  const Original = window.EventSource;
  window.__eventSources = 0;
  window.EventSource = function (...args) {
    window.__eventSources += 1;
    return new Original(...args);
  };
  window.EventSource.prototype = Original.prototype;
  Object.assign(window.EventSource, { CONNECTING: 0, OPEN: 1, CLOSED: 2 });
})();
"""


def require_browser() -> None:
    """Skip (with the reason) when chromium or Playwright is missing, unless in CI: fail."""
    missing = []
    if not CHROMIUM.exists():
        missing.append(f"{CHROMIUM} (apt-get install chromium; scripts/test installs it)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright package (pip install -e '.[dev]')")
    if not missing:
        return
    reason = "browser tests need " + " and ".join(missing)
    if os.environ.get("CI"):
        pytest.fail(reason + "; CI is set, so this is a failure, not a skip", pytrace=False)
    pytest.skip(reason)


class WebUIServer:
    """A real `reveille serve` subprocess with its web UI on a free loopback port."""

    def __init__(
        self,
        home: Path,
        *,
        demo_delay: float = 2.0,
        env: dict[str, str] | None = None,
        webui_port: int | None = None,
    ) -> None:
        self.home = home
        self.webui_port = webui_port or free_port()
        full_env = {
            **os.environ,
            "REVEILLE_HOME": str(home),
            "REVEILLE_DEMO_DELAY_SECONDS": str(demo_delay),
            "REVEILLE_WEBUI_PORT": str(self.webui_port),
            "REVEILLE_SHELL_WORKDIR": str(home),
            "API_SERVER_KEY": API_KEY,
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        for name in ("REVEILLE_CONFIG", "REVEILLE_WEBUI_PASSWORD", "REVEILLE_PROVIDER"):
            full_env.pop(name, None)
        full_env.update(env or {})
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; from reveille.cli import main; sys.exit(main(sys.argv[1:]))",
                "serve",
                "--port",
                "0",
            ],
            cwd=ROOT,
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.webui_port}"
        self._wait_ready()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def output(self) -> str:
        return "".join(self.lines)

    def _wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"reveille serve exited; output:\n{self.output()}")
            try:
                self.get("/api/bootstrap")
                return
            except (OSError, urllib.error.URLError):
                time.sleep(0.1)
        self.stop()
        raise AssertionError(f"the web UI never answered; output:\n{self.output()}")

    def api_port(self) -> int:
        """The OpenAI-compatible API server's port, from the banner."""
        found = self.wait_for(
            lambda: re.search(r"listening on http://127\.0\.0\.1:(\d+)/v1", self.output()),
            "the API server's address in the banner",
        )
        return int(found.group(1))

    def post(self, path: str, body: dict[str, Any]) -> Any:
        """A state-changing web UI request, with the CSRF token as the browser sends it."""
        token = self.get("/api/bootstrap")["csrf_token"]
        request = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json", "X-CSRF-Token": token},
        )
        with urllib.request.urlopen(request, timeout=10) as resp:
            return json.loads(resp.read() or b"null")

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=10) as resp:
            return json.loads(resp.read())

    def wait_for(self, predicate: Any, what: str, timeout: float = 30) -> Any:
        """Poll `predicate()` until it answers something truthy."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            last = predicate()
            if last:
                return last
            time.sleep(0.1)
        raise AssertionError(f"{what} did not happen in {timeout} s; output:\n{self.output()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


class SlowModel:
    """An OpenAI-compatible chat completions endpoint that streams `words` slowly: what a
    real provider looks like to a tab reloaded in the middle of a reply. While `failing`, it
    answers every request 500."""

    def __init__(self, words: list[str], delay: float) -> None:
        self.words = words
        self.delay = delay
        self.requests = 0
        self.bodies: list[dict[str, Any]] = []  # what each request sent (its messages...)
        self.failing = False  # answer 500, as a provider that is down does
        model = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                model.requests += 1
                model.bodies.append(body)
                if model.failing:
                    self._fail()
                elif body.get("stream"):
                    self._stream()
                else:
                    self._json(
                        {
                            "id": "c1",
                            "object": "chat.completion",
                            "created": int(time.time()),
                            "model": "slow",
                            "choices": [
                                {
                                    "index": 0,
                                    "message": {"role": "assistant", "content": model.text},
                                    "finish_reason": "stop",
                                }
                            ],
                            "usage": {
                                "prompt_tokens": 1,
                                "completion_tokens": 1,
                                "total_tokens": 2,
                            },
                        }
                    )

            def _fail(self) -> None:
                raw = json.dumps({"error": {"message": "the model is down", "type": "server"}})
                self.send_response(500)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw.encode())

            def _json(self, data: dict[str, Any]) -> None:
                raw = json.dumps(data).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def _stream(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                try:
                    for index, word in enumerate(model.words):
                        piece = word if index == 0 else " " + word
                        self._chunk({"role": "assistant", "content": piece}, None)
                        time.sleep(model.delay)
                    self._chunk({}, "stop")
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass
                self.close_connection = True

            def _chunk(self, delta: dict[str, Any], finish: str | None) -> None:
                chunk = {
                    "id": "c1",
                    "object": "chat.completion.chunk",
                    "created": int(time.time()),
                    "model": "slow",
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                }
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def text(self) -> str:
        return " ".join(self.words)

    @property
    def env(self) -> dict[str, str]:
        """What points a `reveille serve` at this model."""
        return {
            "REVEILLE_PROVIDER": "openai",
            "OPENAI_BASE_URL": self.url,
            "OPENAI_API_KEY": "sk-test",
            "REVEILLE_MODEL": "slow",
        }

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Shots:
    """Numbered screenshots of one test's steps under test-artifacts/screenshots/."""

    def __init__(self, name: str) -> None:
        self.prefix = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
        self.count = 0
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def __call__(self, page: Any, step: str) -> Path:
        self.count += 1
        path = SCREENSHOTS / f"{self.prefix}-{self.count:02d}-{step}.png"
        page.screenshot(path=str(path))
        return path


def iter_items(detail: dict[str, Any], kind: str) -> Iterator[dict[str, Any]]:
    return (item for item in detail.get("items", []) if item.get("kind") == kind)
