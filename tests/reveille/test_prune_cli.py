"""`reveille prune [--dry-run]` run as an operator would (a real subprocess), and the late
questions about a pruned row: `reveille deliveries show`, ``get_durable_delegation``, the
web UI's deliveries API."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path

import pytest

import api.deliveries as web_deliveries
import storage
from delivery.ledger import Ledger
from delivery.responses_backend import Change, ResponseRow
from delivery.retention import DAY
from tests.delivery._support import FakeClock, finished_row
from tests.reveille.test_deliveries_cli import reveille
from tests.sessions._support import make_session, run_sync
from tests.stores import session_file_store, sqlite_ledger
from tools.async_delegation import configure_runtime, get_durable_delegation, reset_runtime
from tools.completion_queue import CompletionQueue


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A state directory made 40 days ago: one delivered row, one pending, one running; a
    session compacted then (two archived rows, its summary) and a response that ended then,
    beside one that ended now."""
    clock = FakeClock(time.time() - 40 * DAY)
    ledger = Ledger(sqlite_ledger(tmp_path / "ledger.db"), clock=clock, monotonic=clock.monotonic)
    finished_row(ledger, "deleg_old")
    token = ledger.claim("deleg_old", "test")
    assert token and ledger.complete("deleg_old", token)
    finished_row(ledger, "deleg_owed")  # never delivered: owed, whatever its age
    ledger.create("deleg_busy", kind="delegation", state="running")
    ledger.backend.close()
    with session_file_store(tmp_path / "sessions.db", clock=clock) as store:
        make_session(store, "s_old")
        ids = [store.append_message("s_old", r, r).id for r in ("user", "assistant")]
        assert store.take_turn("s_old", "st_old").stream_id == "st_old"
        summary = {"role": "system", "content": "[reveille:summary] old", "display_metadata": {}}
        assert run_sync(store.acompact("s_old", "st_old", ids, summary)) is not None
        assert store.end_turn("s_old", "st_old")
    responses = storage.open_storage(f"sqlite://{tmp_path}").open_responses()
    for rid, at in (("resp_old", clock()), ("resp_new", time.time())):
        responses.insert(ResponseRow(rid, "queued", True, "s_" + rid, "{}", "{}", at, at), [])
        done = Change("completed", "{}", completed_at=at, notified=True)
        assert responses.transition(
            rid,
            expect=("queued",),
            owner=None,
            change=done,
            events=[("response.completed", "{}")],
            check_owner=False,
        )
    responses.close()
    return tmp_path


def test_dry_run_counts_and_writes_nothing(home: Path) -> None:
    out = reveille(home, "prune", "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "settled_ledger_rows: would remove 1 (older than 30 days)" in out.stdout
    assert "archived_transcript_rows: would remove 2 (older than 30 days)" in out.stdout
    assert "stored_responses: would remove 1 (older than 30 days)" in out.stdout
    assert "not wired" not in out.stdout
    assert "total: would remove 4" in out.stdout
    shown = reveille(home, "deliveries", "show", "deleg_old")
    assert "pruned" not in shown.stdout


def test_prune_removes_the_settled_row_and_a_late_question_gets_its_tombstone(home: Path) -> None:
    out = reveille(home, "prune")
    assert out.returncode == 0, out.stderr
    assert "settled_ledger_rows: removed 1 (older than 30 days)" in out.stdout
    assert "archived_transcript_rows: removed 2 (older than 30 days)" in out.stdout
    assert "stored_responses: removed 1 (older than 30 days)" in out.stdout
    assert "/s" in out.stdout  # the rate
    for name in ("ledger.db:", "sessions.db:", "responses.db:"):  # the space given back
        assert name in out.stdout
    with session_file_store(home / "sessions.db") as store:
        left = store.messages("s_old")
        assert [m.content for m in left] == ["[reveille:summary] old"]
    responses = storage.open_storage(f"sqlite://{home}").open_responses()
    try:
        assert responses.get("resp_old") is None and responses.get("resp_new") is not None
    finally:
        responses.close()

    shown = reveille(home, "deliveries", "show", "deleg_old")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("deleg_old: pruned on ")
    assert "retention: settled more than 30 days before" in shown.stdout
    as_json = json.loads(reveille(home, "deliveries", "show", "deleg_old", "--json").stdout)
    assert as_json["state"] == "completed" and as_json["pruned"].startswith("pruned on ")
    again = reveille(home, "deliveries", "redeliver", "deleg_old")
    assert again.returncode == 1 and "was pruned on" in again.stderr
    missing = reveille(home, "deliveries", "show", "deleg_never")
    assert missing.returncode == 1 and "no ledger row" in missing.stderr

    listed = reveille(home, "deliveries", "list", "--json").stdout.splitlines()
    assert {json.loads(line)["id"] for line in listed} == {"deleg_owed", "deleg_busy"}


def test_an_older_ledger_file_is_converted_and_shrinks(home: Path) -> None:
    path = home / "ledger.db"
    raw = sqlite3.connect(path, isolation_level=None)
    raw.executescript("PRAGMA auto_vacuum = NONE; VACUUM;")  # as files made before retention
    raw.close()
    kept = reveille(home, "prune", "--no-vacuum")
    assert "run without --no-vacuum to shrink it" in kept.stdout
    out = reveille(home, "prune")
    assert out.returncode == 0, out.stderr
    assert "converted to incremental vacuum" in out.stdout
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA auto_vacuum").fetchone()[0] == 2
    raw.close()


def test_prune_on_an_empty_home_says_so(tmp_path: Path) -> None:
    out = reveille(tmp_path / "nothing", "prune")
    assert out.returncode == 0 and "nothing to prune" in out.stdout


def test_bad_retention_setting_is_refused(home: Path) -> None:
    (home / "config.toml").write_text("[retention]\nsettled_days = -3\n")
    out = reveille(home, "prune")
    assert out.returncode == 2
    assert "retention_settled_days" in out.stderr and "must not be negative" in out.stderr


def test_the_contract_and_the_web_ui_answer_pruned_on(home: Path) -> None:
    assert reveille(home, "prune").returncode == 0
    configure_runtime(home / "ledger.db", completion_queue=CompletionQueue())
    try:
        found = get_durable_delegation("deleg_old")
        assert found is not None
        assert found["pruned"].startswith("pruned on ") and found["result"] is None
        assert (found["state"], found["delivery_state"]) == ("completed", "delivered")
        assert get_durable_delegation("deleg_owed")["result"] is not None  # type: ignore[index]
        assert get_durable_delegation("deleg_never") is None
        with pytest.raises(web_deliveries.UnknownDelivery) as gone:
            web_deliveries.get("deleg_old")
        assert gone.value.pruned and gone.value.pruned.startswith("pruned on ")
        with pytest.raises(web_deliveries.UnknownDelivery) as never:
            web_deliveries.get("deleg_never")
        assert never.value.pruned is None
    finally:
        reset_runtime()


async def test_a_server_prunes_on_its_own(home: Path) -> None:
    from agent.providers.demo import DemoModel
    from reveille.app import serve
    from reveille.settings import Settings

    settings = Settings(home=home, port=0, webui_port=0, api_key="k", retention_interval_seconds=1)
    try:
        async with serve(settings, provider=DemoModel(delay_seconds=0)) as app:
            ledger = app.runtime.ledger
            for _ in range(1000):  # the first prune comes one interval after the start
                if await asyncio.to_thread(ledger.pruned, "deleg_old"):
                    break
                await asyncio.sleep(0.02)
            assert await asyncio.to_thread(ledger.get, "deleg_old") is None
            assert await asyncio.to_thread(ledger.get, "deleg_owed") is not None
            assert await asyncio.to_thread(ledger.get, "deleg_busy") is not None
            # The same scheduler prunes stored responses ([responses] keep_days).
            store = storage.open_storage(f"sqlite://{home}").open_responses()
            try:
                for _ in range(1000):
                    if await asyncio.to_thread(store.get, "resp_old") is None:
                        break
                    await asyncio.sleep(0.02)
                assert await asyncio.to_thread(store.get, "resp_old") is None
                assert await asyncio.to_thread(store.get, "resp_new") is not None
            finally:
                store.close()
    finally:
        reset_runtime()


def test_prune_against_postgresql(tmp_path: Path) -> None:
    from tests.pg_support import fresh_url
    from tests.stores import pg_ledger

    url = fresh_url()
    clock = FakeClock(time.time() - 40 * DAY)
    ledger = Ledger(pg_ledger(url), clock=clock, monotonic=clock.monotonic)
    finished_row(ledger, "deleg_old")
    token = ledger.claim("deleg_old", "test")
    assert token and ledger.complete("deleg_old", token)
    finished_row(ledger, "deleg_owed")
    ledger.backend.close()

    env = {"REVEILLE_DATABASE_URL": url}
    dry = reveille(tmp_path, "prune", "--dry-run", env=env)
    assert "settled_ledger_rows: would remove 1" in dry.stdout, dry.stderr
    out = reveille(tmp_path, "prune", env=env)
    assert out.returncode == 0, out.stderr
    assert "settled_ledger_rows: removed 1" in out.stdout
    assert ".db:" not in out.stdout  # autovacuum's to reclaim: no file to shrink
    shown = reveille(tmp_path, "deliveries", "show", "deleg_old", env=env)
    assert shown.stdout.startswith("deleg_old: pruned on "), shown.stderr
    assert "deleg_owed" in reveille(tmp_path, "deliveries", "list", env=env).stdout
