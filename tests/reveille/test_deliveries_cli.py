"""`reveille deliveries`: the operator's commands, run as a user would (a real subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from delivery.ledger import Ledger
from delivery.rows import LedgerRow, RowQuery
from tests.ports import free_port
from tests.stores import sqlite_ledger


def reveille(
    home: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reveille.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "REVEILLE_HOME": str(home), **(env or {})},
        timeout=60,
    )


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A state directory with three finished delegations: delivered, pending, pending."""
    ledger = Ledger(sqlite_ledger(tmp_path / "ledger.db"))
    for i, goal in enumerate(["write the report", "check the <b>links</b>", "tidy up"]):
        row_id = f"deleg_{i:04d}"
        ledger.create(
            row_id,
            kind="delegation",
            state="running",
            goal=goal,
            session_key="agent:main:telegram:dm:42",
            request={"type": "async_delegation", "delegation_id": row_id},
        )
        ledger.finish(
            row_id,
            expected="running",
            state="completed",
            event={
                "type": "async_delegation",
                "delegation_id": row_id,
                "goal": goal,
                "status": "completed",
                "summary": f"done {i}",
            },
        )
    token = ledger.claim("deleg_0000", "test")
    assert token
    ledger.complete("deleg_0000", token)
    ledger.backend.close()
    return tmp_path


def test_list_is_a_readable_table_with_filters(home: Path) -> None:
    out = reveille(home, "deliveries", "list")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:4] == ["ID", "KIND", "STATE", "DELIVERY"]
    assert len(lines) == 4
    pending = reveille(home, "deliveries", "list", "--delivery-state", "pending", "--json")
    ids = {json.loads(line)["id"] for line in pending.stdout.splitlines()}
    assert ids == {"deleg_0001", "deleg_0002"}
    other = reveille(home, "deliveries", "list", "--session", "someone-else")
    assert "no rows match" in other.stdout


def test_list_search_finds_goal_words_in_the_whole_ledger(home: Path) -> None:
    """``--search`` matches a goal's words (prefixes, any case) through the ledger's text
    index however old the row; what is typed is words only, so no input is an error."""
    ledger = Ledger(sqlite_ledger(home / "ledger.db"))
    futures = [
        ledger.submit_create(f"deleg_new{i:04d}", kind="delegation", goal=f"job {i}")
        for i in range(300)
    ]
    for future in futures:
        future.result()
    ledger.backend.close()

    def search(*words: str) -> list[str]:
        out = reveille(home, "deliveries", "list", "--json", "--limit", "5", *words)
        assert out.returncode == 0, out.stderr
        return [json.loads(line)["id"] for line in out.stdout.splitlines()]

    assert search("--search", "REPORT writ") == ["deleg_0000"]
    assert search("--search", "links", "--delivery-state", "pending") == ["deleg_0001"]
    assert search("--search", "links", "--delivery-state", "delivered") == []
    assert search("--search", '"tidy*" NEAR(') == []  # "near" is a word here: no goal holds it
    assert search("--search", '"tidy*') == ["deleg_0002"]
    assert search("--search", "job 29") == [f"deleg_new{i:04d}" for i in (299, 298, 297, 296, 295)]
    table = reveille(home, "deliveries", "list", "--search", "***")
    assert table.returncode == 0 and "no rows match" in table.stdout, table.stderr


def test_show_prints_the_event_and_history(home: Path) -> None:
    out = reveille(home, "deliveries", "show", "deleg_0001")
    assert out.returncode == 0, out.stderr
    assert "check the <b>links</b>" in out.stdout
    assert '"summary": "done 1"' in out.stdout


def test_drop_then_redeliver_gives_a_fresh_budget_and_is_recorded(home: Path) -> None:
    dropped = reveille(home, "deliveries", "drop", "deleg_0001", "--reason", "user reset")
    assert dropped.returncode == 0, dropped.stderr
    again = reveille(home, "deliveries", "redeliver", "deleg_0001")
    assert again.returncode == 0, again.stderr
    ledger = Ledger(sqlite_ledger(home / "ledger.db"))
    row = ledger.get("deleg_0001")
    assert row is not None
    assert (row.delivery_state, row.delivery_attempts) == ("pending", 0)
    actions = [h["action"] for h in ledger.history("deleg_0001")]
    assert actions == ["drop", "redeliver"]
    ledger.backend.close()
    shown = reveille(home, "deliveries", "show", "deleg_0001")
    assert "user reset" in shown.stdout and "redeliver" in shown.stdout


def _snapshot(home: Path) -> list[tuple[LedgerRow, list]]:
    ledger = Ledger(sqlite_ledger(home / "ledger.db"))
    try:
        return [(row, ledger.history(row.id)) for row in ledger.query(RowQuery(limit=100))]
    finally:
        ledger.backend.close()


def test_operator_errors_are_clear_and_change_nothing(home: Path) -> None:
    before = _snapshot(home)
    unknown = reveille(home, "deliveries", "show", "deleg_nope")
    assert unknown.returncode == 1 and "no ledger row 'deleg_nope'" in unknown.stderr
    delivered = reveille(home, "deliveries", "redeliver", "deleg_0000")
    assert delivered.returncode == 1
    assert "only a dropped row can be redelivered" in delivered.stderr
    settled = reveille(home, "deliveries", "drop", "deleg_0000")
    assert settled.returncode == 1 and "not pending" in settled.stderr
    assert reveille(home, "deliveries", "list", "--state", "bogus").returncode == 2
    assert _snapshot(home) == before


def test_a_missing_ledger_is_reported_not_created(tmp_path: Path) -> None:
    out = reveille(tmp_path / "fresh", "deliveries", "list")
    assert out.returncode == 0
    assert "no ledger at" in out.stdout
    assert not (tmp_path / "fresh" / "ledger.db").exists()


def test_bad_settings_name_the_variable(tmp_path: Path) -> None:
    env_home = tmp_path
    env = {**os.environ, "REVEILLE_HOME": str(env_home), "REVEILLE_MAX_ATTEMPTS": "many"}
    out = subprocess.run(
        [sys.executable, "-m", "reveille.cli", "deliveries", "list"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 2
    assert "$REVEILLE_MAX_ATTEMPTS" in out.stderr


def test_chat_against_a_dead_port_says_it_cannot_connect() -> None:
    port = free_port()  # nobody listens there
    out = subprocess.run(
        [sys.executable, "-m", "reveille.cli", "chat", "--url", f"http://127.0.0.1:{port}/v1"],
        input="hello\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert "cannot connect" in out.stderr and "reveille serve" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_file_that_is_not_a_ledger_gets_two_lines_not_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "ledger.db").write_bytes(b"my notes, not a database\n" * 100)
    out = reveille(tmp_path, "deliveries", "list")
    assert out.returncode == 1
    assert "not a Reveille ledger" in out.stderr and "nothing was" in out.stderr
    assert "Traceback" not in out.stderr
    assert (tmp_path / "ledger.db").read_bytes().startswith(b"my notes")  # left untouched


def test_a_locked_ledger_is_called_locked_not_broken(home: Path) -> None:
    import sqlite3

    holder = sqlite3.connect(home / "ledger.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        out = reveille(home, "deliveries", "drop", "deleg_0001", "--reason", "r")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert out.returncode == 1
    assert "locked by another process" in out.stderr and "nothing was written" in out.stderr
    assert "not a" not in out.stderr and "Traceback" not in out.stderr
    assert reveille(home, "deliveries", "show", "deleg_0001").returncode == 0  # still healthy


def test_servers_lists_the_live_servers_of_the_state_directory(home: Path) -> None:
    from tests.delivery._support import identity_of, start_idle_child, stop_child

    assert reveille(home, "deliveries", "servers").stdout.strip() == (
        "no server is running on this state directory"
    )
    child = start_idle_child()
    try:
        backend = sqlite_ledger(home / "ledger.db")
        Ledger(backend, identity=str(identity_of(child.pid))).servers.register("api 127.0.0.1:9")
        backend.close()
        out = reveille(home, "deliveries", "servers")
        assert out.returncode == 0, out.stderr
        assert f"pid {child.pid}" in out.stdout and "(api 127.0.0.1:9)" in out.stdout
    finally:
        stop_child(child)
    # A dead server is not listed, and its record is pruned.
    out = reveille(home, "deliveries", "servers")
    assert "no server is running" in out.stdout
