"""Tests of the SQLite backend's own storage: the file, group commit, several backends on one
file, cross-process wake-ups. The ledger's rules are tested over every backend in
``test_ledger.py``; crashes in ``test_crash.py``.
"""

from __future__ import annotations

import os
import re
import socket
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from delivery.errors import (
    DuplicateDeliveryError,
    LedgerError,
    LedgerUnavailable,
    NotALedgerError,
)
from delivery.ledger import Ledger
from delivery.reoffer import ReofferScheduler
from delivery.rows import RowQuery
from storage.sql import PENDING_COUNTS as _PENDING_COUNTS
from storage.sqlite.ledger import GOALS_BATCH, SQL_ACTIVE_OWNERS, SQL_OWNED_BY, SqliteBackend
from storage.sqlite.notifier import poke_dir, wake_dir_for
from tests.delivery._support import REMOTE_IDENTITY, FakeClock, delegation_event, finished_row
from tests.delivery.test_ledger import _count_passes, _Offers
from tests.stores import sqlite_ledger


@pytest.fixture
def backend(db_path: Path) -> Iterator[SqliteBackend]:
    b = sqlite_ledger(db_path)
    yield b
    b.close()


@pytest.fixture
def ledger(backend: SqliteBackend, clock: FakeClock) -> Ledger:
    return Ledger(backend, clock=clock)


# -- the SQLite file ---------------------------------------------------------------------------


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


class TestSqliteFile:
    def test_missing_directory_is_created_and_files_are_0600(self, tmp_path: Path) -> None:
        path = tmp_path / "a" / "b" / "c" / "ledger.db"
        backend = sqlite_ledger(path)
        try:
            Ledger(backend).create("r1", kind="delegation")
            assert path.parent.is_dir() and _mode(path.parent) == 0o700
            assert _mode(path) == 0o600
            for suffix in ("-wal", "-shm"):
                side = Path(str(path) + suffix)
                assert side.exists() and _mode(side) == 0o600, suffix
        finally:
            backend.close()

    def test_wal_and_an_indexed_due_predicate(self, backend: SqliteBackend, db_path: Path) -> None:
        conn = sqlite3.connect(db_path)
        try:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            assert conn.execute("PRAGMA application_id").fetchone()[0] == 0x52564C4C
            plan = " ".join(
                str(r)
                for r in conn.execute(
                    "EXPLAIN QUERY PLAN SELECT id FROM deliveries "
                    "WHERE delivery_state = 'pending' AND due_at <= 5 ORDER BY due_at"
                )
            )
            assert "ix_pending" in plan
        finally:
            conn.close()

    @pytest.mark.usefixtures("backend")
    def test_the_pending_rows_queries_read_the_one_pending_index(self, db_path: Path) -> None:
        """``ix_pending`` (every pending row, by due time and holder) answers the due rows,
        the earliest due time, the counts, restore's scan and the holders, none of them by
        scanning every row."""
        queries = (
            (
                "SELECT min(due_at) FROM deliveries WHERE delivery_state = 'pending'"
                " AND due_at IS NOT NULL",
                (),
            ),
            (_PENDING_COUNTS, (1.0,)),
            (
                "SELECT COUNT(*), COUNT(claim_token) FROM deliveries"
                " WHERE delivery_state = 'pending'",
                (),
            ),
            (
                "SELECT id FROM deliveries WHERE delivery_state = 'pending'"
                " AND completed_at IS NOT NULL AND event IS NOT NULL"
                " ORDER BY completed_at, id LIMIT 5",
                (),
            ),
            (
                "SELECT DISTINCT holder FROM deliveries"
                " WHERE delivery_state = 'pending' AND holder IS NOT NULL",
                (),
            ),
            (
                "SELECT id FROM deliveries WHERE delivery_state = 'pending' AND holder = ? LIMIT 5",
                ("someone",),
            ),
        )
        with sqlite3.connect(db_path) as conn:
            for query, args in queries:
                plan = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {query}", args)]
                assert any(re.search(r"USING INDEX ix_pending\b", step) for step in plan), (
                    query,
                    plan,
                )
        conn.close()

    @pytest.mark.usefixtures("backend")
    def test_recovery_finds_active_owners_through_the_narrow_index(self, db_path: Path) -> None:
        """The owners' index holds only queued and running rows; recovery's two queries
        must still be answered from it, not by scanning every row ever written."""
        with sqlite3.connect(db_path) as conn:
            for query, args in (
                (SQL_ACTIVE_OWNERS, ("running",)),
                (SQL_OWNED_BY, ("running", "someone", 5)),
            ):
                plan = " ".join(str(r) for r in conn.execute(f"EXPLAIN QUERY PLAN {query}", args))
                assert "ix_state_owner" in plan, (query, plan)
        conn.close()

    def test_an_older_file_gets_the_narrow_indexes_and_still_finds_its_rows(
        self, db_path: Path, clock: FakeClock
    ) -> None:
        """A file whose indexes still hold every row (as files made before they were
        narrowed do) has them rebuilt once on open, without the rows whose holder, hook or
        session id is missing, and without finished work in the owners' index; the two
        indexes of pending rows ``ix_pending`` replaced are dropped; every query of those
        columns finds what it did."""
        backend = sqlite_ledger(db_path)
        ledger = Ledger(backend, clock=clock)
        finished_row(ledger, "deleg_done")
        ledger.create("deleg_busy", kind="delegation", state="running", origin_ui_session_id="ui-1")
        backend.close()
        narrowed = ("ix_pending_hook",)
        columns = ("hook",)
        sessions = ("ix_session_key", "ix_origin_session", "ix_origin_ui_session")
        session_columns = ("session_key", "origin_session_id", "origin_ui_session_id")
        with sqlite3.connect(db_path) as conn:  # as an older version wrote them
            for name, column in zip(narrowed, columns, strict=True):
                conn.execute(f"DROP INDEX {name}")
                conn.execute(
                    f"CREATE INDEX {name} ON deliveries({column}) WHERE delivery_state = 'pending'"
                )
            for name, column in zip(sessions, session_columns, strict=True):
                conn.execute(f"DROP INDEX {name}")
                conn.execute(f"CREATE INDEX {name} ON deliveries({column})")
            conn.execute("DROP INDEX ix_state_owner")
            conn.execute("CREATE INDEX ix_state_owner ON deliveries(state, owner)")
            conn.execute("DROP INDEX ix_pending")  # its three forerunners over the same rows
            conn.execute(
                "CREATE INDEX ix_pending_holder ON deliveries(holder)"
                " WHERE delivery_state = 'pending'"
            )
            conn.execute(
                "CREATE INDEX ix_pending_due ON deliveries(due_at) WHERE delivery_state = 'pending'"
            )
            conn.execute(
                "CREATE INDEX ix_pending_completed ON deliveries(completed_at)"
                " WHERE delivery_state = 'pending'"
            )
        conn.close()

        backend = sqlite_ledger(db_path)
        try:
            with sqlite3.connect(db_path) as conn:
                found = dict(
                    conn.execute(
                        "SELECT name, sql FROM sqlite_master WHERE type = 'index'"
                    ).fetchall()
                )
            conn.close()
            for name, column in zip(narrowed + sessions, columns + session_columns, strict=True):
                assert f"{column} IS NOT NULL" in found[name], found[name]
            for gone in ("ix_pending_due", "ix_pending_completed", "ix_pending_holder"):
                assert gone not in found, gone
            assert "IS NOT NULL" not in found["ix_pending"]  # counts scan it
            assert "(due_at, holder)" in found["ix_pending"]
            assert "WHERE state IN ('queued', 'running')" in found["ix_state_owner"]
            busy = backend.get("deleg_busy")
            assert busy is not None and busy.owner is not None
            assert backend.active_owners("running") == [busy.owner]
            assert [r.id for r in backend.rows_owned_by(busy.owner, "running", 10)] == [
                "deleg_busy"
            ]
            assert backend.active_owners("queued") == []
            done = backend.get("deleg_done")
            assert done is not None and done.due_at is not None and done.holder is not None
            assert [r.id for r in backend.due(done.due_at, 10)] == ["deleg_done"]
            assert backend.next_due_at() == done.due_at
            assert backend.pending_holders() == [done.holder]
            assert [r.id for r in backend.rows_held_by(done.holder, 10)] == ["deleg_done"]
            assert backend.delivery_counts()["pending"] == 2
            for session, found_ids in (("sess", ["deleg_done"]), ("ui-1", ["deleg_busy"])):
                rows = backend.query(RowQuery(session=session))
                assert [r.id for r in rows] == found_ids
        finally:
            backend.close()

    @pytest.mark.parametrize(
        "content",
        [b"hello, this is a text file\n", b'{"not": "sqlite"}' * 300, bytes(range(256)) * 40],
        ids=["text", "json", "binary"],
    )
    def test_a_file_that_is_not_a_database_is_refused_and_untouched(
        self, tmp_path: Path, content: bytes
    ) -> None:
        path = tmp_path / "ledger.db"
        path.write_bytes(content)
        with pytest.raises(NotALedgerError, match="not a SQLite database") as info:
            sqlite_ledger(path)
        assert str(path) in str(info.value)
        assert path.read_bytes() == content
        assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger.db"]

    def test_a_directory_is_refused(self, tmp_path: Path) -> None:
        (tmp_path / "ledger.db").mkdir()
        with pytest.raises(NotALedgerError, match="directory"):
            sqlite_ledger(tmp_path / "ledger.db")

    def test_another_apps_sqlite_database_is_refused(self, tmp_path: Path) -> None:
        path = tmp_path / "other.db"
        conn = sqlite3.connect(path)
        conn.execute("CREATE TABLE notes (body TEXT)")
        conn.execute("INSERT INTO notes VALUES ('keep me')")
        conn.commit()
        conn.close()
        with pytest.raises(NotALedgerError, match="something else"):
            sqlite_ledger(path)
        conn = sqlite3.connect(path)
        try:
            assert conn.execute("SELECT body FROM notes").fetchall() == [("keep me",)]
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
            assert "deliveries" not in tables
        finally:
            conn.close()

    def test_another_apps_sqlite_database_is_left_byte_for_byte(self, tmp_path: Path) -> None:
        path = tmp_path / "other.db"
        conn = sqlite3.connect(path)
        conn.execute("CREATE TABLE notes (body TEXT)")
        conn.commit()
        conn.close()
        before = path.read_bytes()
        with pytest.raises(NotALedgerError, match="left untouched"):
            sqlite_ledger(path)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]
        assert path.read_bytes() == before

    def test_a_newer_schema_is_refused(self, db_path: Path) -> None:
        sqlite_ledger(db_path).close()
        conn = sqlite3.connect(db_path)
        conn.execute("PRAGMA user_version = 99")
        conn.close()
        with pytest.raises(LedgerError, match="newer"):
            sqlite_ledger(db_path)

    def test_reopening_keeps_rows(self, db_path: Path, clock: FakeClock) -> None:
        first = sqlite_ledger(db_path)
        finished_row(Ledger(first, clock=clock), "r1")
        first.close()
        second = sqlite_ledger(db_path)
        try:
            row = Ledger(second, clock=clock).get("r1")
            assert row is not None and row.event["summary"] == "result of r1"
        finally:
            second.close()

    @pytest.mark.parametrize("how", ["removed", "replaced"])
    def test_a_removed_or_replaced_file_makes_writes_fail(
        self, ledger: Ledger, db_path: Path, how: str
    ) -> None:
        finished_row(ledger, "r1")
        for suffix in ("", "-wal", "-shm"):
            Path(str(db_path) + suffix).unlink(missing_ok=True)
        if how == "replaced":
            db_path.write_bytes(b"someone else's file")
        with pytest.raises(LedgerUnavailable, match="removed or replaced"):
            ledger.create("r2", kind="delegation")
        with pytest.raises(LedgerUnavailable):
            ledger.claim("r1", "c")
        if how == "replaced":
            assert db_path.read_bytes() == b"someone else's file"
        else:
            assert not db_path.exists()

    def test_a_database_locked_past_the_timeout_fails_clearly_and_writes_nothing(
        self, db_path: Path, clock: FakeClock
    ) -> None:
        backend = sqlite_ledger(db_path, busy_timeout_ms=100)
        ledger = Ledger(backend, clock=clock)
        finished_row(ledger, "r1")
        blocker = sqlite3.connect(db_path, isolation_level=None)
        try:
            blocker.execute("BEGIN IMMEDIATE")  # another process holds the write lock
            with pytest.raises(LedgerUnavailable, match="locked"):
                ledger.create("r2", kind="delegation")
            with pytest.raises(LedgerUnavailable, match="nothing was written"):
                ledger.claim("r1", "c")
            blocker.execute("ROLLBACK")
            assert ledger.get("r2") is None
            row = ledger.get("r1")
            assert row is not None and row.delivery_attempts == 0
            # Once the lock is gone the same operations go through.
            ledger.create("r2", kind="delegation")
            assert ledger.claim("r1", "c")
        finally:
            blocker.close()
            backend.close()

    def test_a_closed_backend_refuses_writes(self, db_path: Path) -> None:
        backend = sqlite_ledger(db_path)
        backend.close()
        with pytest.raises(LedgerUnavailable, match="closed"):
            Ledger(backend).create("r1", kind="delegation")


# -- concurrency -------------------------------------------------------------------------------


class TestConcurrency:
    def test_claims_and_acks_commit_without_waiting_for_the_disk(
        self, ledger: Ledger, backend: SqliteBackend
    ) -> None:
        finished_row(ledger, "r1")
        before = backend.stats()
        token = ledger.claim("r1", "c")
        assert token and ledger.complete("r1", token)
        after = backend.stats()
        assert after["commits"] - before["commits"] == 2
        assert after["durable_commits"] == before["durable_commits"]  # synchronous=NORMAL
        ledger.create("r2", kind="delegation")  # the row before the work: FULL
        assert backend.stats()["durable_commits"] == after["durable_commits"] + 1

    def test_a_batch_with_one_durable_write_is_durable(self, backend: SqliteBackend) -> None:
        writer = backend._writer
        waiting = []
        before = backend.stats()
        with writer._mu:  # hold the writer so that the three writes form one batch
            writer._busy = True
        try:
            for i, durable in enumerate((False, True, False)):
                row = {
                    "id": f"b{i}",
                    "kind": "delegation",
                    "state": "running",
                    "delivery_state": "pending",
                    "created_at": 1.0,
                    "updated_at": 1.0,
                }
                waiting.append(backend.submit(lambda tx, row=row: tx.insert(row), durable=durable))
        finally:
            writer._release_inline()
        for fut in waiting:
            fut.result(timeout=10)
        after = backend.stats()
        assert after["commits"] - before["commits"] == 1  # one batch, one commit ...
        assert after["durable_commits"] - before["durable_commits"] == 1  # ... at FULL

    def test_group_commit_shares_commits_between_threads(
        self, ledger: Ledger, backend: SqliteBackend
    ) -> None:
        threads_n, per_thread = 8, 30
        barrier = threading.Barrier(threads_n)
        errors: list[BaseException] = []

        def work(t: int) -> None:
            try:
                barrier.wait()
                for i in range(per_thread):
                    row_id = f"t{t}-{i}"
                    ledger.create(row_id, kind="delegation", state="running")
                    ledger.finish(
                        row_id,
                        expected="running",
                        state="completed",
                        event=delegation_event(row_id),
                    )
                    token = ledger.claim(row_id, f"c{t}")
                    assert token and ledger.complete(row_id, token)
            except BaseException as exc:
                errors.append(exc)

        before = backend.stats()
        threads = [threading.Thread(target=work, args=(t,)) for t in range(threads_n)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not errors, errors
        after = backend.stats()
        ops = after["operations"] - before["operations"]
        commits = after["commits"] - before["commits"]
        items = threads_n * per_thread
        # Four operations an item, and the writer's own: a batch of goals indexed for
        # every GOALS_BATCH rows inserted.
        assert items * 4 <= ops <= items * 4 + items // GOALS_BATCH + 1
        assert commits < ops, (commits, ops)
        delivered = ledger.query(RowQuery(delivery_state="delivered", limit=10_000))
        assert len(delivered) == threads_n * per_thread

    def test_submitted_operations_share_one_commit_and_fail_alone(
        self, ledger: Ledger, backend: SqliteBackend
    ) -> None:
        ledger.create("dup", kind="delegation")
        before = backend.stats()["commits"]
        futures = [
            ledger.submit_create(f"s{i}", kind="delegation") if i != 5 else None for i in range(50)
        ]
        bad = ledger.submit_create("dup", kind="delegation")
        results = [f.result() for f in futures if f is not None]
        with pytest.raises(DuplicateDeliveryError):
            bad.result()
        assert len(results) == 49 and len(ledger.query(RowQuery(limit=1000))) == 50
        assert backend.stats()["commits"] - before < 51

    def test_sixteen_backends_racing_to_claim_one_row_exactly_one_wins(
        self, db_path: Path, clock: FakeClock
    ) -> None:
        n = 16
        shared = sqlite_ledger(db_path)
        own = [sqlite_ledger(db_path) for _ in range(n)]
        try:
            ledgers = [Ledger(own[i] if own else shared, clock=clock) for i in range(n)]
            for round_ in range(20):
                row_id = f"race-{round_}"
                finished_row(ledgers[0], row_id)
                barrier = threading.Barrier(n)
                tokens: list[str | None] = [None] * n

                def claim(
                    i: int, row_id: str = row_id, barrier: Any = barrier, tokens: Any = tokens
                ) -> None:
                    barrier.wait()
                    tokens[i] = ledgers[i].claim(row_id, f"consumer-{i}")

                threads = [threading.Thread(target=claim, args=(i,)) for i in range(n)]
                for th in threads:
                    th.start()
                for th in threads:
                    th.join()
                winners = [t for t in tokens if t]
                assert len(winners) == 1, (round_, tokens)
                row = ledgers[0].get(row_id)
                assert row is not None
                assert row.claim_token == winners[0] and row.delivery_attempts == 1
        finally:
            for b in [shared, *own]:
                b.close()


# -- the holders of pending rows ----------------------------------------------------------


_HOLDERS_SCAN = "SELECT DISTINCT holder"


class TestPendingHolders:
    """``pending_holders`` scans all of ``ix_pending``; the re-offer scheduler asks twice a
    pass, and an idle server passes every few seconds. The answer is read again only when
    the deliveries may have changed: by this process or by any other connection."""

    def _scans(self, backend: SqliteBackend) -> list[str]:
        statements: list[str] = []
        backend._reader().set_trace_callback(statements.append)  # this thread's reader
        return statements

    def test_asked_again_with_nothing_written_it_answers_without_a_scan(
        self, backend: SqliteBackend, ledger: Ledger
    ) -> None:
        finished_row(ledger, "deleg_a")
        scans = self._scans(backend)
        assert backend.pending_holders() == [ledger.identity]
        ledger.servers.heartbeat()  # a write, but not to the deliveries
        for _ in range(3):
            assert backend.pending_holders() == [ledger.identity]
        assert sum(s.startswith(_HOLDERS_SCAN) for s in scans) == 1

    def test_a_write_of_this_process_is_seen(self, backend: SqliteBackend, ledger: Ledger) -> None:
        finished_row(ledger, "deleg_a")
        assert backend.pending_holders() == [ledger.identity]
        token = ledger.claim("deleg_a", "consumer")
        assert token is not None
        assert ledger.complete("deleg_a", token)
        assert backend.pending_holders() == []
        finished_row(ledger, "deleg_b")
        assert backend.pending_holders() == [ledger.identity]

    def test_another_processs_write_is_seen(
        self, backend: SqliteBackend, ledger: Ledger, db_path: Path, clock: FakeClock
    ) -> None:
        finished_row(ledger, "deleg_a")
        assert backend.pending_holders() == [ledger.identity]
        other = sqlite_ledger(db_path)  # its own connections, as another process has
        try:
            finished_row(Ledger(other, clock=clock, identity=REMOTE_IDENTITY), "deleg_b")
        finally:
            other.close()
        assert sorted(backend.pending_holders()) == sorted([ledger.identity, REMOTE_IDENTITY])
        with sqlite3.connect(db_path) as conn:  # not through any ledger at all
            conn.execute("UPDATE deliveries SET holder = 'someone' WHERE id = 'deleg_a'")
        conn.close()
        assert sorted(backend.pending_holders()) == sorted(["someone", REMOTE_IDENTITY])
        assert sorted(backend.pending_holders()) == sorted(["someone", REMOTE_IDENTITY])

    def test_a_writer_that_cannot_write_still_leaves_the_holders_readable(
        self, db_path: Path, clock: FakeClock
    ) -> None:
        backend = sqlite_ledger(db_path, busy_timeout_ms=100)
        ledger = Ledger(backend, clock=clock)
        blocker = sqlite3.connect(db_path, isolation_level=None)
        try:
            finished_row(ledger, "deleg_a")
            assert backend.pending_holders() == [ledger.identity]
            blocker.execute("BEGIN IMMEDIATE")  # another process holds the write lock
            blocker.execute("UPDATE deliveries SET holder = 'someone' WHERE id = 'deleg_a'")
            with pytest.raises(LedgerUnavailable, match="locked"):
                ledger.servers.heartbeat()
            assert backend.pending_holders() == [ledger.identity]  # not committed yet
            blocker.execute("COMMIT")
            assert backend.pending_holders() == ["someone"]
        finally:
            blocker.close()
            backend.close()


# -- wake-ups between processes ------------------------------------------------------------


class TestCrossProcessWakeups:
    def test_an_operators_redeliver_in_another_process_wakes_the_scheduler(
        self, backend: SqliteBackend, tmp_path: Path
    ) -> None:
        real_backend = backend
        wake_dir = wake_dir_for(backend.path)
        assert backend.url == "sqlite://" + backend.path and backend.path.startswith("/")
        ledger = Ledger(real_backend)
        event = finished_row(ledger, "r1")
        token = ledger.claim("r1", "c")
        assert token and ledger.drop("r1", "session reset", token=token)
        offers = _Offers()
        passes = _count_passes(ledger)
        sched = ReofferScheduler(ledger, offers, max_sleep_seconds=60)
        sched.start()
        try:
            # A stale socket of a process that is gone is cleaned up, not counted.
            stale = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            stale.bind(os.path.join(wake_dir, "gone.sock"))
            stale.close()
            time.sleep(0.2)
            idle_passes = len(passes)
            # The operator's CLI: its own Ledger object (no listener of ours) on the same file.
            operator = Ledger(real_backend, identity=REMOTE_IDENTITY)
            operator.redeliver("r1", actor="cli")
            time.sleep(0.3)
            assert offers.items == [] and len(passes) == idle_passes  # nothing told us yet
            poked_at = time.time()
            assert operator.notify_others() == 1  # what `reveille deliveries redeliver` does
            assert offers.event.wait(5)
            assert offers.items[0][0] - poked_at < 0.5
            assert offers.items[0][1]["summary"] == event["summary"]
            assert "gone.sock" not in os.listdir(wake_dir)
        finally:
            sched.stop()
        assert os.listdir(wake_dir) == []  # stop() removes its socket
        assert poke_dir(str(tmp_path / "missing")) == 0
