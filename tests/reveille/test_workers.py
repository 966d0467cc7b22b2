"""`reveille serve --workers N`: real supervisor and worker processes on real loopback ports,
and the setting that asks for them."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from reveille.settings import SettingsError, load_settings
from tests.api_server.serve_support import ROOT, Server, call, chat, ledger_rows, wait_until
from tests.ports import free_port

WORKERS = ("--workers", "2")


def live_workers(supervisor: int) -> set[int]:
    """The pids of the supervisor's children still running (not zombies)."""
    out = subprocess.run(
        ["ps", "--ppid", str(supervisor), "-o", "pid=,stat="],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return {int(pid) for pid, stat in (line.split() for line in out.splitlines()) if stat[0] != "Z"}


def answering_pids(port: int, want: set[int], tries: int = 200) -> set[int]:
    """The worker pids that `/health` reports over new connections, until all of ``want``
    answered (each request is a new connection, which the kernel may give any worker)."""
    seen: set[int] = set()
    for _ in range(tries):
        status, _, body = call(port, "GET", "/health")
        assert status == 200
        seen.add(body["pid"])
        if want <= seen:
            break
    return seen


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def server(tmp_path: Path):
    started = Server(tmp_path, args=WORKERS, extra_env={"REVEILLE_WEBUI_PORT": str(free_port())})
    try:
        yield started
    finally:
        if started.proc.poll() is None:
            started.proc.kill()
            started.proc.wait()


def test_two_workers_answer_on_one_port(server: Server) -> None:
    server.wait_for(re.compile(r"listening on http://127\.0\.0\.1:\d+/v1 with 2 workers"))
    assert "".join(server.lines).count("Reveille is listening") == 1  # one banner
    workers = live_workers(server.proc.pid)
    assert len(workers) == 2 and server.proc.pid not in workers
    for index in range(20):
        _, reply = chat(server.port, f"hello, request {index}")
        assert reply
    assert answering_pids(server.port, workers) == workers
    # The web UI's port is shared as well.
    webui = re.search(r"web UI: (http://127\.0\.0\.1:\d+/)", "".join(server.lines))
    assert webui is not None
    for _ in range(4):
        with urllib.request.urlopen(webui.group(1), timeout=10) as resp:
            assert resp.status == 200


def test_a_killed_worker_is_started_again(server: Server) -> None:
    before = live_workers(server.proc.pid)
    assert len(before) == 2
    victim = min(before)
    os.kill(victim, signal.SIGKILL)
    server.wait_for(re.compile(rf"worker \d \(pid {victim}\) was killed by SIGKILL"))
    server.wait_for(re.compile(r"worker \d started again: pid \d+"))

    def two_live() -> set[int] | None:
        workers = live_workers(server.proc.pid)
        return workers if len(workers) == 2 else None

    after = wait_until(two_live)
    assert victim not in after and len(after - before) == 1
    for index in range(10):
        _, reply = chat(server.port, f"after the kill {index}")
        assert reply
    assert answering_pids(server.port, after) == after


def test_sigterm_stops_every_worker_and_exits_zero(server: Server) -> None:
    workers = live_workers(server.proc.pid)
    assert len(workers) == 2
    chat(server.port, "one turn before the end")
    began = time.monotonic()
    assert server.stop(signal.SIGTERM) == 0
    assert time.monotonic() - began < 10
    assert not any(alive(pid) for pid in workers)
    assert "all 2 workers stopped" in "".join(server.lines)


def test_one_worker_is_one_process(tmp_path: Path) -> None:
    single = Server(tmp_path)
    try:
        assert live_workers(single.proc.pid) == set()
        assert "workers" not in single.wait_for(re.compile("Reveille is listening.*")).group(0)
        _, _, health = call(single.port, "GET", "/health")
        assert health["pid"] == single.proc.pid
        assert single.stop() == 0
    finally:
        if single.proc.poll() is None:
            single.proc.kill()


@pytest.mark.parametrize(
    ("env", "toml", "flag", "expected"),
    [
        ({}, None, None, 1),
        ({"REVEILLE_WORKERS": "3"}, None, None, 3),
        ({"REVEILLE_WORKERS": "auto"}, None, None, os.cpu_count()),
        ({"REVEILLE_WORKERS": " AUTO "}, None, None, os.cpu_count()),
        ({}, "workers = 4", None, 4),
        ({}, 'workers = "auto"', None, os.cpu_count()),
        ({"REVEILLE_WORKERS": "2"}, "workers = 4", None, 2),
        ({"REVEILLE_WORKERS": "2"}, None, "5", 5),
    ],
)
def test_workers_setting(
    tmp_path: Path, env: dict[str, str], toml: str | None, flag: str | None, expected: int
) -> None:
    if toml:
        (tmp_path / "config.toml").write_text(f"[server]\n{toml}\n")
    s = load_settings({"REVEILLE_HOME": str(tmp_path), **env}, workers=flag)
    assert s.workers == expected


@pytest.mark.parametrize("bad", ["0", "-1", "abc", "", "1.5", "true"])
def test_a_bad_worker_count_is_refused_with_the_reason(tmp_path: Path, bad: str) -> None:
    with pytest.raises(SettingsError, match=r"\$REVEILLE_WORKERS: workers = .* or auto"):
        load_settings({"REVEILLE_HOME": str(tmp_path), "REVEILLE_WORKERS": bad})
    (tmp_path / "config.toml").write_text("[server]\nworkers = 0\n")
    with pytest.raises(
        SettingsError, match=r"config\.toml \[server\] workers: workers = 0 .*at least 1, or auto"
    ):
        load_settings({"REVEILLE_HOME": str(tmp_path)})
    (tmp_path / "config.toml").write_text("[server]\nworkers = true\n")
    with pytest.raises(SettingsError, match="workers = True"):
        load_settings({"REVEILLE_HOME": str(tmp_path)})


def test_the_command_line_refuses_a_bad_worker_count(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "reveille.cli", "serve", "--workers", "0"],
        cwd=ROOT,
        env={**os.environ, "REVEILLE_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "bad setting: command line: workers = '0' is not valid" in done.stderr


def test_telegram_long_polling_needs_one_worker(tmp_path: Path) -> None:
    env = {"REVEILLE_HOME": str(tmp_path), "TELEGRAM_BOT_TOKEN": "1:x", "REVEILLE_WORKERS": "2"}
    with pytest.raises(SettingsError, match="long polling allows one poller"):
        load_settings(env)
    hooked = load_settings(
        {**env, "TELEGRAM_WEBHOOK_URL": "https://bot.example/hook", "TELEGRAM_SECRET_TOKEN": "s"}
    )
    assert hooked.workers == 2
    assert load_settings({**env, "REVEILLE_WORKERS": "1"}).workers == 1


def test_wake_ups_come_home_through_any_worker_without_a_key(tmp_path: Path) -> None:
    """A wake-up is a self-POST to the shared port, so it lands on any worker: every worker
    takes it as the server's own (the secret the supervisor gives them all), so it runs at
    the first attempt and is stored as a wake-up (its card), whichever worker takes it."""
    workers = Server(
        tmp_path,
        key=None,
        args=WORKERS,
        extra_env={
            "REVEILLE_WEBUI_PORT": str(free_port()),
            "REVEILLE_SHELL_ENABLED": "1",
            "REVEILLE_SHELL_WORKDIR": str(tmp_path),
            "REVEILLE_SHELL_APPROVALS": "never",
        },
    )
    try:
        workers.wait_for(re.compile(r"with 2 workers"))
        sessions = [chat(workers.port, f"run in the background: echo {i}")[0] for i in range(8)]

        def delivered() -> list[Any] | None:
            rows = [r for r in ledger_rows(tmp_path) if r.kind == "process"]
            done = len(rows) == 8 and all(r.delivery_state == "delivered" for r in rows)
            return rows if done else None

        rows = wait_until(delivered, timeout=60)
        assert [r.delivery_attempts for r in rows] == [1] * 8
        for session_id in sessions:
            status, _, data = call(workers.port, "GET", f"/api/sessions/{session_id}/messages")
            assert status == 200
            wakes = [m for m in data["data"] if (m["display_metadata"] or {}).get("wake")]
            assert len(wakes) == 1, data["data"]
    finally:
        workers.stop()


def test_workers_never_import_from_the_directory_they_were_started_in(tmp_path: Path) -> None:
    """A `reveille serve --workers 2` started in a directory that holds modules named like
    Reveille's own: the workers run the installed code, and the planted modules never run."""
    planted = tmp_path / "cwd"
    planted.mkdir()
    marker = tmp_path / "planted-code-ran"
    hostile = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\nraise SystemExit(3)\n"
    for name in ("reveille.py", "gateway.py", "delivery.py", "storage.py", "tools.py", "api.py"):
        (planted / name).write_text(hostile)
    server = Server(
        tmp_path / "home",
        args=WORKERS,
        extra_env={"REVEILLE_WEBUI_PORT": str(free_port())},
        cwd=planted,
    )
    try:
        server.wait_for(re.compile(r"listening on http://127\.0\.0\.1:\d+/v1 with 2 workers"))
        _, reply = chat(server.port, "hello from any directory")
        assert reply
        assert len(live_workers(server.proc.pid)) == 2
        assert server.stop() == 0
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()
    assert not marker.exists(), marker.read_text()
