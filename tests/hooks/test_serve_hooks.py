"""Inbound events through real `reveille serve` processes (SQLite state directory).

- An event posted twice with one ``webhook-id`` gives one wake-up in the configured
  conversation (a transcript row ``display_kind = "inbound_event"`` restating the payload).
- A bad signature is 401 and writes nothing.
- A server SIGKILLed right after its 2xx still wakes the conversation once it is started
  again: the event and its wake-up row were written before the answer.
- `reveille hooks secret` prints a secret once per call (a rotation keeps the old one
  verifying), `reveille hooks list` shows the route and the last event.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from gateway.wake import INBOUND_DISPLAY_KIND
from gateway.webhooks import new_secret, sign
from tests.api_server.serve_support import Server, chat, ledger_rows, transcript, wait_until


def _reveille(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reveille.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "REVEILLE_HOME": str(home)},
        timeout=60,
    )


def _post(port: int, secret: str, msg_id: str, payload: object) -> int:
    body = json.dumps(payload)
    stamp = int(time.time())
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/hooks/ci",
        data=body.encode(),
        method="POST",
        headers={
            "Content-Type": "application/json",
            "webhook-id": msg_id,
            "webhook-timestamp": str(stamp),
            "webhook-signature": sign(secret, msg_id, stamp, body),
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _inbound(port: int, session_id: str) -> list[dict]:
    return [m for m in transcript(port, session_id) if m["display_kind"] == INBOUND_DISPLAY_KIND]


def test_inbound_events_come_home_once_across_a_sigkill(tmp_path: Path) -> None:
    first = Server(tmp_path)
    try:
        session_id, _ = chat(first.port, "hello")
    finally:
        first.stop()
    (tmp_path / "config.toml").write_text(f'[hooks.ci]\nsession = "{session_id}"\n')
    made = _reveille(tmp_path, "hooks", "secret", "ci")
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip()
    assert secret.startswith("whsec_")

    second = Server(tmp_path)
    try:
        assert _post(second.port, new_secret(), "bad", {"build": 1}) == 401
        assert _post(second.port, secret, "msg_1", {"build": 41, "status": "red"}) == 200
        assert _post(second.port, secret, "msg_1", {"build": 41, "status": "red"}) == 200
        assert _post(second.port, secret, "msg_2", {"build": 42, "status": "green"}) == 200
    finally:
        second.stop(signal.SIGKILL)  # right after the 2xx

    rotated = _reveille(tmp_path, "hooks", "secret", "ci")  # the old one keeps verifying
    assert rotated.returncode == 0 and "rotated" in rotated.stderr
    third = Server(tmp_path)
    try:
        wait_until(lambda: len(_inbound(third.port, session_id)) >= 2)
        assert _post(third.port, secret, "msg_3", {"build": 43}) == 200  # old, in overlap
        assert _post(third.port, rotated.stdout.strip(), "msg_4", {"build": 44}) == 200
        wait_until(lambda: len(_inbound(third.port, session_id)) >= 4)
        rows = _inbound(third.port, session_id)
        ids = [r["display_metadata"].get("webhook_id") for r in rows]
        assert sorted(ids) == ["msg_1", "msg_2", "msg_3", "msg_4"], ids  # each once
        green = next(r for r in rows if r["display_metadata"].get("webhook_id") == "msg_2")
        assert '"status": "green"' in green["content"]
    finally:
        third.stop()
    assert not [
        r for r in ledger_rows(tmp_path) if r.kind == "inbound" and r.goal and "bad" in r.goal
    ]
    listed = _reveille(tmp_path, "hooks", "list")
    assert listed.returncode == 0, listed.stderr
    assert f"session {session_id}" in listed.stdout and "msg_4" in listed.stdout
    assert "old one until" in listed.stdout
