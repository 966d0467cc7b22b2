"""`reveille backup` and `reveille restore` with PostgreSQL: a pg_dump of the store's schema,
checked with pg_restore --list, restored with pg_restore into an empty schema and checked
as a server would open it; without pg_dump, a clear message with the manual procedure."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from delivery.ledger import Ledger
from delivery.states import State
from gateway.session import SessionStore
from storage import open_storage
from storage.postgres.backup import dump_schema
from tests.pg_support import PG_URL, fresh_url
from tests.sessions._support import make_session

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    shutil.which("pg_dump") is None or shutil.which("pg_restore") is None,
    reason="pg_dump / pg_restore not installed",
)


def _cli(
    home: Path, url: str, *args: str, path: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "REVEILLE_HOME": str(home), "PYTHONPATH": str(ROOT)}
    env.pop("REVEILLE_CONFIG", None)
    env["REVEILLE_DATABASE_URL"] = url
    if path is not None:
        env["PATH"] = path
    return subprocess.run(
        [sys.executable, "-m", "reveille.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _schema_of(url: str) -> str:
    location = open_storage(url)
    ledger = location.open_ledger()
    try:
        return str(ledger.schema)  # type: ignore[attr-defined]
    finally:
        ledger.close()


def _fill(url: str) -> None:
    location = open_storage(url)
    ledger = Ledger(location.open_ledger())
    store = SessionStore(location.open_sessions())
    try:
        ledger.create("deleg_backup1", kind="delegation", session_key="k", state=State.RUNNING)
        make_session(store, "s1")
    finally:
        store.close()
        ledger.close()


def test_a_postgresql_store_is_dumped_checked_and_restored(tmp_path: Path) -> None:
    url = fresh_url()
    _fill(url)
    schema = _schema_of(url)
    home = tmp_path / "home"
    (home / "processes").mkdir(parents=True)
    (home / "processes" / "out.log").write_text("output")
    made = _cli(home, url, "backup", str(tmp_path / "b"))
    assert made.returncode == 0, made.stderr
    dump = tmp_path / "b" / "reveille.pgdump"
    assert stat.S_IMODE(dump.stat().st_mode) == 0o600
    assert (tmp_path / "b" / "processes" / "out.log").read_text() == "output"
    listing = subprocess.run(
        ["pg_restore", "--list", str(dump)], capture_output=True, text=True, check=True
    ).stdout
    assert dump_schema(listing) == schema

    refused = _cli(tmp_path / "fresh", url, "restore", str(tmp_path / "b"))
    assert refused.returncode == 1 and "holds a Reveille store already" in refused.stderr
    assert not (tmp_path / "fresh").exists()

    with psycopg.connect(PG_URL, autocommit=True) as conn:  # the database is lost
        conn.execute(f"DROP SCHEMA {schema} CASCADE")
    restored = _cli(tmp_path / "fresh", url, "restore", str(tmp_path / "b"))
    assert restored.returncode == 0, restored.stderr
    assert (tmp_path / "fresh" / "processes" / "out.log").read_text() == "output"
    location = open_storage(url, migrate=False)
    ledger = Ledger(location.open_ledger())
    store = SessionStore(location.open_sessions())
    try:
        row = ledger.get("deleg_backup1")
        assert row is not None and row.state == State.RUNNING
        assert store.get_session("s1") is not None
    finally:
        store.close()
        ledger.close()


def test_without_pg_dump_the_procedure_is_printed_and_nothing_copied(tmp_path: Path) -> None:
    url = fresh_url()
    open_storage(url)  # migrated
    empty = tmp_path / "no-tools"
    empty.mkdir()
    done = _cli(tmp_path / "home", url, "backup", str(tmp_path / "b"), path=str(empty))
    assert done.returncode == 2
    assert "pg_dump is not installed" in done.stderr
    assert "pg_dump --serializable-deferrable --format=custom" in done.stderr
    assert "pg_restore --single-transaction" in done.stderr
    assert not (tmp_path / "b").exists()


def test_the_password_never_reaches_a_command_line(tmp_path: Path) -> None:
    from storage.postgres.backup import _conninfo

    conninfo, env = _conninfo("postgresql://u:s3cret@db.example/reveille?sslmode=require")
    assert "s3cret" not in conninfo and env["PGPASSWORD"] == "s3cret"
    assert "sslmode=require" in conninfo
