"""The adopter of delegation rows (``McpTasks``) on a real SQLite ledger: a row of a dead
server that carries an MCP task is taken over; one without a task is declined and settles
``unknown`` as it always did; a task of a server not configured here ends ``failed`` with
that reason (never silence)."""

from __future__ import annotations

from pathlib import Path

import pytest

from delivery.ledger import Ledger
from tests.delivery._support import exited_identity
from tests.stores import sqlite_ledger
from tools.completion_queue import CompletionQueue
from tools.delegation_runtime import DelegationRuntime
from tools.mcp import tasks
from tools.mcp.tasks import MCP_TASK, McpTasks


def _runtime(path: Path, identity: str | None = None) -> DelegationRuntime:
    return DelegationRuntime(Ledger(sqlite_ledger(str(path)), identity=identity), CompletionQueue())


def _running(ledger: Ledger, row_id: str, request: dict[str, object]) -> None:
    ledger.create(
        row_id,
        kind="delegation",
        state="running",
        session_key="s",
        goal="call tasks__brew",
        request={"type": "async_delegation", "delegation_id": row_id, **request},
    )


def test_rows_with_a_task_are_adopted_and_others_settle_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tasks, "ADOPT_WAIT_SECONDS", 0.0)
    path = tmp_path / "ledger.db"
    dead = _runtime(path, exited_identity())
    _running(dead.ledger, "deleg_plain", {})
    _running(dead.ledger, "deleg_task", {MCP_TASK: {"server": "gone", "task_id": "t1"}})
    dead.close()

    survivor = _runtime(path)
    adopter = McpTasks()
    adopter.attach(survivor, lambda name: None)  # no MCP server of that name here
    try:
        survivor.ledger.recover_abandoned()
        plain = survivor.ledger.get("deleg_plain")
        assert plain is not None and plain.state == "unknown"
        event = survivor.queue.get(timeout=10)
        assert event["delegation_id"] == "deleg_task" and event["status"] == "failed"
        assert event["error"] == "MCP server gone is not configured on this Reveille server"
        assert event["adopted"] is True
        task_row = survivor.ledger.get("deleg_task")
        assert task_row is not None and task_row.state == "failed"
        assert task_row.owner == survivor.ledger.identity
    finally:
        survivor.close()
