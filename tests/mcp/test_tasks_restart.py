"""An MCP task outlives the Reveille server that started it: ``reveille serve`` (a real
subprocess) calls the task server's ``brew`` in the background, is SIGKILLed while the ~5 s
task runs, and the server restarted on the same home (SQLite), or a second server sharing
the PostgreSQL store (already running when the first dies), adopts the row from the task id
stored on it and delivers the result into the conversation exactly once; the row is never
settled ``interrupted`` or ``unknown``, nor after a graceful restart (SIGTERM, a drain)."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from gateway.wake import DELEGATION_DISPLAY_KIND
from tests.api_server.serve_support import Server, call, chat, ledger_rows, transcript, wait_until
from tools.mcp.tasks import MCP_TASK

from ._tasks_support import TaskServer, task_server


def _server(home: Path, tasks: TaskServer, env: dict[str, str] | None = None) -> Server:
    home.mkdir(exist_ok=True)
    (home / "config.toml").write_text(tasks.toml())
    return Server(home, extra_env={"REVEILLE_PEER_TIMEOUT_SECONDS": "2", **(env or {})})


def _homecomings(port: int, session_id: str, deleg_id: str) -> list[dict[str, Any]]:
    return [
        m
        for m in transcript(port, session_id)
        if m["display_kind"] == DELEGATION_DISPLAY_KIND
        and (m["display_metadata"] or {}).get("delegation_id") == deleg_id
    ]


def _started(port: int, seconds: float = 5) -> tuple[str, str]:
    args = {"seconds": seconds, "what": "sencha", "background": True}
    session_id, reply = chat(port, f"call tasks__brew with {json.dumps(args)}")
    started = json.loads(reply.removeprefix("tasks__brew returned: "))
    assert started["status"] == "dispatched", reply
    return session_id, str(started["delegation_id"])


def _the_row(where: Path | str, deleg_id: str) -> Any:
    return next((r for r in ledger_rows(where) if r.id == deleg_id), None)


def _task_recorded(where: Path | str, deleg_id: str) -> Any:
    found = _the_row(where, deleg_id)
    return found if found is not None and MCP_TASK in (found.request or {}) else None


def _kill_then_deliver(
    first: Server,
    second_start: Any,
    where: Path | str,
    tasks: TaskServer,
    sig: int = signal.SIGKILL,
) -> None:
    try:
        session_id, deleg_id = _started(first.port)
        row = wait_until(lambda: _task_recorded(where, deleg_id), 30)
        assert row.state == "running"
        assert tasks.lines("step") == [] or len(tasks.lines("step")) < 5  # still brewing
    finally:
        first.stop(sig)
    assert _the_row(where, deleg_id).state == "running"
    second = second_start()
    try:
        wait_until(lambda: _homecomings(second.port, session_id, deleg_id), 60)
        done = wait_until(
            lambda: (r := _the_row(where, deleg_id)) and r.delivery_state == "delivered" and r,
            30,
        )
        assert done.state == "completed", done
        assert done.event["summary"] == "brewed sencha" and done.event["adopted"] is True
        (message,) = _homecomings(second.port, session_id, deleg_id)
        assert "brewed sencha" in json.dumps(message)
        assert len(tasks.lines("created")) == 1 and len(tasks.lines("result")) == 1
    finally:
        assert second.stop() == 0


def test_a_task_survives_a_sigkill_and_comes_home_once(tmp_path: Path) -> None:
    with task_server(tmp_path) as tasks:
        home = tmp_path / "home"
        first = _server(home, tasks)
        _kill_then_deliver(first, lambda: _server(home, tasks), home, tasks)


def test_another_server_on_postgresql_adopts_the_task(tmp_path: Path) -> None:
    pytest.importorskip("psycopg")
    from tests.pg_support import fresh_url

    url = fresh_url()
    env = {"REVEILLE_DATABASE_URL": url}
    with task_server(tmp_path) as tasks:
        first = _server(tmp_path / "a", tasks, env)
        try:
            second = _server(tmp_path / "b", tasks, env)  # running before the first dies
        except BaseException:
            first.stop(signal.SIGKILL)
            raise
        _kill_then_deliver(first, lambda: second, url, tasks)


def test_a_graceful_restart_leaves_the_task_running_for_the_next_server(tmp_path: Path) -> None:
    # A drain interrupts Reveille's own units; an MCP task goes on at its server, so its row
    # stays running and the next server adopts it.
    with task_server(tmp_path) as tasks:
        home = tmp_path / "home"
        env = {"REVEILLE_DRAIN_SECONDS": "1"}
        first = _server(home, tasks, env)
        _kill_then_deliver(first, lambda: _server(home, tasks, env), home, tasks, signal.SIGTERM)


def test_cancelling_an_adopted_task_reaches_the_mcp_server(tmp_path: Path) -> None:
    with task_server(tmp_path) as tasks:
        home = tmp_path / "home"
        first = _server(home, tasks)
        try:
            _, deleg_id = _started(first.port, seconds=120)
            wait_until(lambda: _task_recorded(home, deleg_id), 30)
        finally:
            first.stop(signal.SIGKILL)
        second = _server(home, tasks)
        try:
            wait_until(lambda: "adopted MCP task" in "".join(second.lines), 30)
            status, _, body = call(second.port, "POST", f"/api/background/{deleg_id}/cancel")
            assert status == 200, body
            (cancelled,) = wait_until(lambda: tasks.lines("cancelled"), 30)
            done = wait_until(
                lambda: (r := _the_row(home, deleg_id)) and r.state != "running" and r
            )
            assert done.state == "cancelled"
            assert cancelled.split()[1] == done.event[MCP_TASK]["task_id"]
        finally:
            assert second.stop() == 0


def test_a_server_stopping_leaves_an_adopted_task_to_the_next(tmp_path: Path) -> None:
    with task_server(tmp_path) as tasks:
        home = tmp_path / "home"
        first = _server(home, tasks)
        try:
            session_id, deleg_id = _started(first.port, seconds=12)
            wait_until(lambda: _task_recorded(home, deleg_id), 30)
        finally:
            first.stop(signal.SIGKILL)
        second = _server(home, tasks, {"REVEILLE_DRAIN_SECONDS": "1"})
        try:
            wait_until(lambda: "adopted MCP task" in "".join(second.lines), 30)
        finally:
            assert second.stop() == 0  # graceful, while the task still brews
        assert _the_row(home, deleg_id).state == "running"
        third = _server(home, tasks)
        try:
            wait_until(lambda: _homecomings(third.port, session_id, deleg_id), 60)
            done = _the_row(home, deleg_id)
            assert done.state == "completed" and done.event["summary"] == "brewed sencha"
            assert len(_homecomings(third.port, session_id, deleg_id)) == 1
            assert len(tasks.lines("cancelled")) == 0
        finally:
            assert third.stop() == 0
