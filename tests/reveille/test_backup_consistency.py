"""A backup taken while clients start background work restores a state in which every unit a
transcript promises ("Started in the background … Handle: deleg_…") has its ledger row, and
every result the ledger calls delivered is in its transcript; a backup without that is
refused or repaired on restore; PostgreSQL gets pg_dump's way.

The writers write in the server's two orders, each client in its own session, on a
100k-row ledger: a start is the unit's ledger row (committed), then the reply that names
it; a delivery is the transcript's result row, then the ledger row marked delivered. Any
copy taken file by file breaks one of the two (ledger first: the first; transcripts first:
the second).
"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from delivery.backend import LedgerTx
from delivery.events import transcript_key
from delivery.ids import new_id, unit_handles
from delivery.ledger import Ledger
from delivery.session_backend import NewMessage, NewSession
from reveille.backup_check import LOST_ERROR
from tests.api_server.serve_support import Server, chat, transcript, wait_until
from tests.sessions._support import run_sync
from tests.stores import sqlite_ledger, sqlite_sessions

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = 6
BACKLOG = 100_000


def _cli(
    home: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "REVEILLE_HOME": str(home), "PYTHONPATH": str(ROOT), **(env or {})}
    full.pop("REVEILLE_CONFIG", None)
    if not env or "REVEILLE_DATABASE_URL" not in env:
        full.pop("REVEILLE_DATABASE_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "reveille.cli", *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _fill_ledger(ledger: Ledger, rows: int) -> None:
    """``rows`` settled delegations, in one transaction (a server's long history)."""
    now = time.time() - 3600

    def op(tx: LedgerTx) -> None:
        for i in range(rows):
            tx.insert(
                {
                    "id": new_id("deleg_"),
                    "kind": "delegation",
                    "state": "completed",
                    "delivery_state": "delivered",
                    "session_key": f"old:{i % 500}",
                    "goal": f"old job {i}",
                    "request": {},
                    "event": {"type": "async_delegation", "summary": "x" * 64},
                    "created_at": now,
                    "updated_at": now,
                    "completed_at": now,
                    "settled_at": now,
                }
            )

    ledger.backend.write(op)


def _promised(home: Path) -> dict[str, str]:
    """Handle -> session of every unit a stored reply in ``home`` names."""
    with sqlite3.connect(home / "sessions.db") as db:
        rows = db.execute("SELECT session_id, content FROM messages WHERE role = 'assistant'")
        return {h: sid for sid, text in rows for h in unit_handles(text)}


def _delivered_without_result(home: Path) -> list[str]:
    """Client units the ledger calls delivered whose result row the transcript lacks."""
    with sqlite3.connect(home / "ledger.db") as db:
        db.execute("ATTACH DATABASE ? AS s", (str(home / "sessions.db"),))
        rows = db.execute(
            "SELECT d.id FROM deliveries d WHERE d.delivery_state = 'delivered' "
            "AND d.origin_session_id LIKE 'api_client%' AND NOT EXISTS (SELECT 1 FROM "
            "s.messages m WHERE m.dedupe_key = ? || d.id)",
            (transcript_key(""),),
        )
        return [row[0] for row in rows]


def _ledger_ids(home: Path) -> set[str]:
    with sqlite3.connect(home / "ledger.db") as db:
        return {row[0] for row in db.execute("SELECT id FROM deliveries")}


class Clients:
    """``CLIENTS`` threads starting background work until stopped, as the server writes it."""

    def __init__(self, home: Path) -> None:
        self.ledger = Ledger(sqlite_ledger(home / "ledger.db"))
        self.sessions = sqlite_sessions(home / "sessions.db")
        self.started: list[str] = []
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(CLIENTS)]

    def _run(self, index: int) -> None:
        sid = f"api_client{index}"
        try:
            run_sync(self.sessions.acreate_session(sid, NewSession(session_key=f"k:{sid}")))
            while not self.stop.is_set():
                handle = new_id("deleg_")
                self.ledger.create(
                    handle,
                    kind="delegation",
                    state="running",
                    session_key=f"k:{sid}",
                    origin_session_id=sid,
                )  # committed before the reply that names it is stored
                reply = f"Started in the background: job. Handle: {handle}. It comes back here."
                self.sessions.append_message(
                    sid, NewMessage.build({"role": "assistant", "content": reply})
                )
                self.started.append(handle)
                self._deliver(sid, handle)
        except BaseException as exc:  # reported by the test, not lost in a thread
            self.errors.append(exc)

    def _deliver(self, sid: str, handle: str) -> None:
        """The unit ends and its result is delivered: the result row, then the ledger."""
        event = {"type": "async_delegation", "delegation_id": handle, "status": "completed"}
        self.ledger.finish(handle, expected="running", state="completed", event=event)
        token = self.ledger.claim(handle, "test")
        assert token
        result = {
            "role": "system",
            "content": f"[Background delegation finished] {handle}: status completed.",
            "display_kind": "async_delegation_complete",
            "dedupe_key": transcript_key(handle),
        }
        self.sessions.append_message(sid, NewMessage.build(result))
        assert self.ledger.complete(handle, token)

    def __enter__(self) -> Clients:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)
        self.sessions.close()
        self.ledger.close()


def test_a_backup_under_concurrent_writers_restores_every_promised_unit(tmp_path: Path) -> None:
    home, copy, fresh = tmp_path / "home", tmp_path / "backup", tmp_path / "restored"
    filler = Ledger(sqlite_ledger(home / "ledger.db"))
    _fill_ledger(filler, BACKLOG)
    filler.close()

    with Clients(home) as clients:
        while len(clients.started) < CLIENTS * 5 and not clients.errors:
            time.sleep(0.01)
        before = len(clients.started)
        made = _cli(home, "backup", str(copy))
        during = len(clients.started) - before
    assert not clients.errors, clients.errors
    assert made.returncode == 0, made.stderr
    assert during > 0, "no client wrote while the backup ran: nothing was tested"

    # The copy itself holds the invariant...
    promised = _promised(copy)
    assert len(promised) >= before
    lacking = sorted(set(promised) - _ledger_ids(copy))
    assert lacking == [], f"{len(lacking)} of {len(promised)} promised units have no row"
    unseen = _delivered_without_result(copy)
    assert unseen == [], f"{len(unseen)} results delivered by the ledger are not in a transcript"
    # ...and so does the state restored from it, which says it checked.
    restored = _cli(fresh, "restore", str(copy))
    assert restored.returncode == 0, restored.stderr
    assert "every started unit its transcripts name has its ledger row" in restored.stdout
    assert set(_promised(fresh)) <= _ledger_ids(fresh)
    assert len(_ledger_ids(fresh)) >= BACKLOG + len(promised)


def _inconsistent_backup(tmp_path: Path) -> tuple[Path, str, str]:
    """A backup whose transcript names one unit its ledger has and one it lacks (what an
    older, file-by-file `reveille backup` could take)."""
    source = tmp_path / "source"
    ledger = Ledger(sqlite_ledger(source / "ledger.db"))
    sessions = sqlite_sessions(source / "sessions.db")
    kept, lost = new_id("deleg_"), new_id("deleg_")
    run_sync(sessions.acreate_session("api_s1", NewSession(session_key="k:api_s1")))
    ledger.create(kept, kind="delegation", session_key="k:api_s1", origin_session_id="api_s1")
    for handle in (kept, lost):
        text = f"Started in the background: job. Handle: {handle}."
        sessions.append_message("api_s1", NewMessage.build({"role": "assistant", "content": text}))
    # A user quoting a handle is not a promise: never refused for it.
    quoted = f"what about {new_id('deleg_')}?"
    sessions.append_message("api_s1", NewMessage.build({"role": "user", "content": quoted}))
    sessions.close()
    ledger.close()
    copy = tmp_path / "backup"
    assert _cli(source, "backup", str(copy)).returncode == 0
    with sqlite3.connect(copy / "ledger.db") as db:
        db.execute("DELETE FROM deliveries WHERE id = ?", (lost,))
    return copy, kept, lost


def test_restore_refuses_a_backup_that_lost_started_work_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    copy, _, lost = _inconsistent_backup(tmp_path)
    fresh = tmp_path / "fresh"
    done = _cli(fresh, "restore", str(copy))
    assert done.returncode == 1
    assert "not consistent: 1 started unit(s)" in done.stderr
    assert f"{lost} (session api_s1)" in done.stderr
    assert "--repair" in done.stderr
    assert not fresh.exists()  # a rerun finds it as it was


def test_restore_repair_records_the_lost_unit_so_its_conversation_is_told(
    tmp_path: Path,
) -> None:
    copy, kept, lost = _inconsistent_backup(tmp_path)
    fresh = tmp_path / "fresh"
    done = _cli(fresh, "restore", "--repair", str(copy))
    assert done.returncode == 0, done.stderr
    assert f"{lost} recorded as lost" in done.stdout
    ledger = Ledger(sqlite_ledger(fresh / "ledger.db"))
    try:
        row = ledger.get(lost)
        assert row is not None
        assert (row.state, row.delivery_state) == ("unknown", "pending")
        assert row.event is not None
        assert row.event["error"] == LOST_ERROR
        assert (row.event["delegation_id"], row.event["origin_session_id"]) == (lost, "api_s1")
        assert ledger.get(kept) is not None
    finally:
        ledger.close()
    # Repaired once: a second restore of the repaired state needs no repair.
    again = tmp_path / "again"
    assert _cli(fresh, "backup", str(again)).returncode == 0
    assert _cli(tmp_path / "third", "restore", str(again)).returncode == 0


def test_backup_on_an_unreachable_postgresql_copies_nothing_but_local_only_works(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    stale = sqlite_sessions(home / "sessions.db")  # left from before the move to PostgreSQL
    stale.close()
    (home / "telegram.db").write_bytes(b"")
    sqlite3.connect(home / "telegram.db").execute("CREATE TABLE t (x)").connection.close()
    env = {"REVEILLE_DATABASE_URL": "postgresql://u:secret@127.0.0.1:1/reveille"}
    done = _cli(home, "backup", str(tmp_path / "b"), env=env)
    assert done.returncode == 1
    assert "nothing was copied" in done.stderr and "secret" not in done.stderr
    assert not (tmp_path / "b").exists()
    local = _cli(home, "backup", "--local-only", str(tmp_path / "b"), env=env)
    assert local.returncode == 0, local.stderr
    # never the stale SQLite files a server no longer writes
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["telegram.db"]
    assert "not copied" in local.stdout
    refused = _cli(tmp_path / "fresh", "restore", str(tmp_path / "b"), env=env)
    assert refused.returncode == 1 and "reveille.pgdump" in refused.stderr
    assert not (tmp_path / "fresh").exists()


def test_a_repaired_unit_is_told_to_its_conversation_once(tmp_path: Path) -> None:
    """Through real servers: a unit started over the API whose row a backup lacks comes home
    as one `unknown` notice on a server started on the repaired state."""
    home, copy, fresh = tmp_path / "home", tmp_path / "backup", tmp_path / "fresh"
    server = Server(home, demo_delay=30, extra_env={"REVEILLE_DRAIN_SECONDS": "0.5"})
    try:
        session, reply = chat(server.port, "in the background: count the stars")
        found = re.search(r"deleg_[0-9a-f]+", reply)
        assert found, reply
    finally:
        server.stop()
    assert _cli(home, "backup", str(copy)).returncode == 0
    with sqlite3.connect(copy / "ledger.db") as db:  # as a file-by-file copy could lose it
        db.execute("DELETE FROM deliveries WHERE id = ?", (found.group(),))
    assert _cli(fresh, "restore", "--repair", str(copy)).returncode == 0

    restored = Server(fresh)
    try:

        def told() -> list[dict] | None:
            rows = [m for m in transcript(restored.port, session) if m["display_kind"]]
            return rows or None

        (notice,) = wait_until(told)
        text = " ".join(notice["content"].split())
        assert found.group() in text and "status unknown" in text
        assert "the backup holds no record of it" in text
    finally:
        restored.stop()
