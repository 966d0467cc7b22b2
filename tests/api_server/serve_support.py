"""Real `reveille serve` processes for tests: start one on a free port, call it, wait.

``Server`` runs `tests/api_server/_serve_proc.py` (the CLI, optionally holding every
acknowledgement) with a tmp ``REVEILLE_HOME``, the demo model and the web UI off, and
collects its output line by line.
"""

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
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from delivery.rows import LedgerRow, RowQuery
from tests.stores import pg_ledger, sqlite_ledger

ROOT = Path(__file__).resolve().parents[2]
KEY = "serve-test-key"
LISTEN = re.compile(r"Reveille is listening on http://127\.0\.0\.1:(\d+)/v1")


class Server:
    """A `reveille serve` subprocess with its output collected line by line."""

    def __init__(
        self,
        home: Path,
        *,
        hold_ack: bool = False,
        key: str | None = KEY,
        demo_delay: float = 0.05,
        extra_env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
        cwd: Path | None = None,
    ) -> None:
        self.home = home
        env = {
            **os.environ,
            "REVEILLE_HOME": str(home),
            "REVEILLE_DEMO_DELAY_SECONDS": str(demo_delay),
            "REVEILLE_WEBUI_PORT": "0",
            "REVEILLE_SHELL_ENABLED": "1",
            "REVEILLE_SHELL_WORKDIR": str(home),
            # These tests run commands unasked; the approval tests set "always" themselves.
            "REVEILLE_SHELL_APPROVALS": "never",
            "PYTHONUNBUFFERED": "1",
            # The checkout first, whatever an (editable) install in the venv maps.
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        env.pop("API_SERVER_KEY", None)
        env.pop("REVEILLE_CONFIG", None)
        for name in [n for n in env if n.startswith(("TELEGRAM_", "DISCORD_", "MATRIX_"))]:
            env.pop(name)  # a bot of the developer's own must not start in tests
        if key:
            env["API_SERVER_KEY"] = key
        if hold_ack:
            env["REVEILLE_TEST_HOLD_ACK"] = "1"
        env.update(extra_env or {})
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).with_name("_serve_proc.py")),
                "serve",
                "--port",
                "0",
                *args,
            ],
            cwd=cwd or ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()
        try:
            match = self.wait_for(LISTEN)
        except BaseException:
            self._kill()  # a server that never said it listens must not outlive its test
            raise
        self.port = int(match.group(1))
        self.url = f"http://127.0.0.1:{self.port}"

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def wait_for(self, pattern: re.Pattern[str], count: int = 1, timeout: float = 30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [m for line in list(self.lines) if (m := pattern.search(line))]
            if len(found) >= count:
                return found[count - 1]
            if self.proc.poll() is not None and len(found) < count:
                break
            time.sleep(0.05)
        raise AssertionError(f"{pattern.pattern!r} not seen; output:\n{''.join(self.lines)}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        """Signal the server and return its exit code. One that has not exited within
        ``timeout`` is killed (a stray server would hold its port and its files for the rest
        of the run) and the test fails with its output."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired as late:
            self._kill()
            tail = "".join(self.lines[-40:])
            message = f"the server did not stop within {timeout} s; output:\n{tail}"
            raise AssertionError(message) from late

    def _kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


def call(port: int, method: str, path: str, body=None, headers=None) -> tuple[int, dict, dict]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode() if body is not None else None,
        method=method,
        headers={
            "Authorization": f"Bearer {KEY}",
            "Content-Type": "application/json",
            **(headers or {}),
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read())


def chat(
    port: int, message: str, session_id: str | None = None, *, model: str = "reveille-demo"
) -> tuple[str, str]:
    headers = {"X-Hermes-Session-Id": session_id} if session_id else {}
    body = {"model": model, "messages": [{"role": "user", "content": message}]}
    status, resp_headers, data = call(port, "POST", "/v1/chat/completions", body, headers)
    assert status == 200, data
    return resp_headers["X-Hermes-Session-Id"], data["choices"][0]["message"]["content"]


def transcript(port: int, session_id: str) -> list[dict]:
    status, _, data = call(port, "GET", f"/api/sessions/{session_id}/messages")
    assert status == 200
    return data["data"]


def wait_until(check, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


def ledger_rows(home: Path | str) -> list[LedgerRow]:
    """Every ledger row under ``home`` (or in the PostgreSQL database at that url), read
    through a ledger of this test process."""
    from delivery.backend import LedgerBackend
    from delivery.ledger import Ledger

    backend: LedgerBackend
    if isinstance(home, str) and home.startswith("postgresql://"):
        backend = pg_ledger(home, migrate=False)
    else:
        backend = sqlite_ledger(Path(home) / "ledger.db")
    try:
        return Ledger(backend).query(RowQuery(limit=100))
    finally:
        backend.close()


def scrape(port: int, key: str | None = KEY) -> dict[tuple[str, tuple], float]:
    """``GET /metrics`` of the server on ``port``: every sample by name and labels."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    samples: dict[tuple[str, tuple], float] = {}
    for family in text_string_to_metric_families(text):
        assert family.name.startswith("reveille_"), family.name
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float:
    """A sample of ``scrape``'s, 0 when absent (``in`` tells the two apart)."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)
