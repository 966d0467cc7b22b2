"""What only the PostgreSQL store has: migrations, LISTEN/NOTIFY between processes, clear
refusals. (Its ledger and session rules are proved by the conformance suites.)"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from delivery.ledger import Ledger
from delivery.reoffer import ReofferScheduler
from tests.delivery._support import finished_row
from tests.pg_support import fresh_url, require_pg
from tests.sessions._support import run_sync
from tests.stores import pg_ledger, pg_sessions

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def url() -> str:
    require_pg()
    return fresh_url()


def _connect(url: str):
    import psycopg

    return psycopg.connect(url, autocommit=True)


def test_concurrent_starts_migrate_once(url: str) -> None:
    from storage.postgres.migrations import MIGRATIONS, migrate

    # The versions in order (a gap is allowed: steps are numbered by the change that adds them)
    versions = [m.version for m in MIGRATIONS]
    applied: list[list[int]] = []
    barrier = threading.Barrier(8)

    def start() -> None:
        with _connect(url) as conn:
            barrier.wait()
            applied.append(migrate(conn))

    threads = [threading.Thread(target=start) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(applied, key=len) == [[]] * 7 + [versions]
    with _connect(url) as conn:
        rows = conn.execute("SELECT version FROM reveille_schema ORDER BY version").fetchall()
    assert [r[0] for r in rows] == versions


def test_concurrent_processes_migrate_once(url: str) -> None:
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        import storage
        location = storage.open_storage(sys.argv[1])
        location.open_ledger().close()
        location.open_sessions().close()
        print("ok")
        """
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, url], stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert outs == ["ok"] * 4
    with _connect(url) as conn:
        count = conn.execute("SELECT count(*) FROM reveille_schema").fetchone()
    from storage.postgres.migrations import MIGRATIONS

    assert count is not None and count[0] == len(MIGRATIONS)


def test_a_newer_schema_is_refused_untouched(url: str) -> None:
    from storage.postgres.migrations import MIGRATIONS, SchemaTooNew

    pg_ledger(url).close()
    with _connect(url) as conn:
        conn.execute("INSERT INTO reveille_schema VALUES (99, 'from the future', 0)")
    with pytest.raises(SchemaTooNew, match=r"version 99, newer than this Reveille"):
        pg_ledger(url)
    with pytest.raises(SchemaTooNew, match="upgrade Reveille"):
        pg_sessions(url)
    with _connect(url) as conn:
        # Ours, plus the one from the future; nothing added.
        count = conn.execute("SELECT count(*) FROM reveille_schema").fetchone()
        assert count == (len(MIGRATIONS) + 1,)


@pytest.mark.parametrize(
    ("mangle", "says"),
    [
        (lambda u: u.replace("postgres@", "nobody:secret@", 1), "refused the credentials"),
        (lambda u: u.rsplit(":", 1)[0] + ":1/postgres", "nothing accepts connections"),
        (lambda u: u.replace("/postgres?", "/no_such_db?", 1), "database does not exist"),
        (lambda u: "postgresql://[bad", "not valid"),
    ],
)
def test_bad_urls_and_credentials_say_so_in_one_line(url: str, mangle, says: str) -> None:
    from storage.postgres.conn import PostgresUnavailable

    bad = mangle(url)
    with pytest.raises(PostgresUnavailable, match=says) as info:
        pg_ledger(bad)
    message = str(info.value)
    assert "\n" not in message
    assert "secret" not in message


def test_reveille_serve_with_wrong_credentials_prints_one_line_and_exits(
    url: str, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "REVEILLE_HOME": str(tmp_path),
        "REVEILLE_DATABASE_URL": url.replace("postgres@", "nobody:secret@", 1),
        "REVEILLE_PORT": "0",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "reveille.cli", "serve"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "refused the credentials" in lines[0] and "secret" not in lines[0]


_WRITER = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {root!r})
    from delivery.ledger import Ledger
    import storage
    ledger = Ledger(storage.open_storage(sys.argv[1]).open_ledger())
    ledger.redeliver(sys.argv[2], actor="a test's other process")
    print(ledger.notify_others(), flush=True)
    sys.stdin.read()  # stay alive: the wake-up, not this process's exit, must do it
    ledger.close()
    """
)


def test_a_write_in_another_process_wakes_a_sleeping_scheduler(url: str) -> None:

    backend = pg_ledger(url)
    ledger = Ledger(backend)
    finished_row(ledger, "d1")
    assert ledger.drop("d1", "the test drops it")
    offers: list[tuple[float, dict]] = []
    sched = ReofferScheduler(
        ledger, lambda e: offers.append((time.time(), e)), max_sleep_seconds=60
    )
    sched.start()
    child = None
    try:
        time.sleep(0.3)  # the scheduler sleeps now: nothing is due for 60 s
        assert offers == []
        child = subprocess.Popen(
            [sys.executable, "-c", _WRITER.format(root=str(ROOT)), url, "d1"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "1"
        notified = time.time()
        deadline = notified + 10
        while not offers and time.time() < deadline:
            time.sleep(0.01)
        assert [e["delegation_id"] for _, e in offers] == ["d1"]
        assert offers[0][0] - notified < 2.0
        assert child.poll() is None  # woken by NOTIFY, not by the writer's exit
        assert backend.notifier.received >= 1
    finally:
        if child is not None:
            assert child.stdin is not None
            child.stdin.close()
            child.wait(10)
        sched.stop()
        backend.close()


def test_the_listening_connection_reconnects_by_itself(url: str) -> None:
    import select

    backend = pg_ledger(url)
    sub = backend.notifier.subscribe()
    assert sub is not None
    try:
        with _connect(url) as conn:
            killed = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE query LIKE 'LISTEN%%' AND datname = current_database()"
                " AND pid <> pg_backend_pid()"
            ).fetchall()
        assert killed
        deadline = time.time() + 10
        while backend.notifier.reconnects == 0 and time.time() < deadline:
            time.sleep(0.05)
        assert backend.notifier.reconnects >= 1
        assert backend.notifier.wait_listening(10)
        # The reconnection pokes (something may have been missed) ...
        assert select.select([sub.fileno()], [], [], 5)[0]
        sub.drain()
        time.sleep(0.3)
        sub.drain()
        # ... and notifications arrive again on the new connection.
        assert backend.notifier.notify() == 1
        assert select.select([sub.fileno()], [], [], 5)[0]
    finally:
        sub.close()
        backend.close()


async def test_submit_async_does_no_io_on_the_loop(url: str) -> None:

    backend = pg_ledger(url)
    try:
        ledger = Ledger(backend)
        finished_row(ledger, "a1")
        fut = backend.submit_async(ledger._claim_op("a1", "loop"))
        assert not fut.done()  # queued to a writer thread; the loop awaits it
        assert await fut
    finally:
        backend.close()


def test_reads_survive_the_server_dropping_pooled_connections(url: str) -> None:
    from delivery.session_backend import NewSession

    backend = pg_ledger(url)
    sessions = pg_sessions(url)
    try:
        ledger = Ledger(backend)
        finished_row(ledger, "r1")
        run_sync(sessions.acreate_session("s1", NewSession()))
        assert backend.get("r1") is not None and sessions.get_session("s1") is not None
        with _connect(url) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND application_name = '' AND query NOT LIKE 'LISTEN%%'"
            )
        time.sleep(0.2)
        assert backend.get("r1") is not None
        assert sessions.get_session("s1") is not None
        # The writer reconnects too: the next write fails at most once, then succeeds.
        for _ in range(2):
            try:
                token = ledger.claim("r1", "after")
                break
            except Exception:
                continue
        assert token and ledger.complete("r1", token)
    finally:
        sessions.close()
        backend.close()


async def test_one_statement_batches_go_in_one_pipeline_and_others_run_plainly(url: str) -> None:
    """Same answers either way: a batch of compare-and-sets is sent as one pipeline; a batch
    in which one operation needs a second statement is rolled back and run plainly; an
    operation whose only statement fails (a duplicate id) fails alone in its pipeline."""
    from delivery.errors import DuplicateDeliveryError

    backend = pg_ledger(url)
    try:
        ledger = Ledger(backend)
        ids = [f"p{i}" for i in range(8)]
        for row_id in ids:
            finished_row(ledger, row_id)

        async def batch(*ops):
            """Run ``ops`` as one batch (the writer is held until all are queued); their
            outcomes, and how many batches went as a pipeline."""
            running, go = threading.Event(), threading.Event()

            def hold(tx):
                running.set()
                go.wait(10)

            held = backend.submit_async(hold)
            await asyncio.to_thread(running.wait, 10)
            before = backend.stats()["pipelined_commits"]
            futures = [backend.submit_async(op) for op in ops]
            go.set()
            await held
            outcomes = await asyncio.gather(*futures, return_exceptions=True)
            return outcomes, backend.stats()["pipelined_commits"] - before

        tokens, counts = await batch(*(ledger._claim_op(row_id, "c") for row_id in ids))
        assert all(isinstance(t, str) for t in tokens) and counts == 1

        # p0 is claimed: claiming it again misses, and looks at the row (a second statement).
        again, counts = await batch(
            ledger._claim_op("p0", "other"),
            *(ledger._complete_op(i, t) for i, t in zip(ids[1:], tokens[1:], strict=True)),
        )
        assert again[0] is None and all(done is True for done in again[1:])
        assert counts == 0
        assert [r.delivery_state for r in map(ledger.get, ids[1:])] == ["delivered"] * 7

        dup_row = {**ledger.get("p1").as_dict(), "id": "p0"}  # type: ignore[union-attr]
        fresh_row = {**ledger.get("p1").as_dict(), "id": "p9"}  # type: ignore[union-attr]
        made, counts = await batch(
            lambda tx: tx.insert(dup_row), lambda tx: tx.insert(fresh_row) or "made"
        )
        assert isinstance(made[0], DuplicateDeliveryError) and made[1] == "made"
        assert counts == 1
        assert ledger.get("p9") is not None and ledger.get("p0").delivery_state == "pending"

        # An insert and its audit entry (a timer's schedule) stay one pipeline: the entries
        # are written together before the COMMIT, each with its row, in order.
        def scheduled(row_id: str):
            row = {**ledger.get("p1").as_dict(), "id": row_id}  # type: ignore[union-attr]

            def op(tx):
                tx.insert(row)
                tx.audit(row_id, "schedule", f"{row_id} first", 1.0)
                return row_id

            return op

        timers = [f"t{i}" for i in range(4)]
        made, counts = await batch(*(scheduled(t) for t in timers))
        assert made == timers and counts == 1
        for t in timers:
            assert [(e["action"], e["detail"]) for e in ledger.history(t)] == [
                ("schedule", f"{t} first")
            ]

        # An audit entry before the statement sent ahead runs the batch the ordinary way.
        def audit_first(tx):
            tx.audit("p9", "note", "before", 2.0)
            return tx.update("p9", {"delivery_state": "delivered"}, {"refunds": 1})

        done, counts = await batch(audit_first, scheduled("t9"))
        assert done == [True, "t9"] and counts == 0
        assert ("note", "before") in [(e["action"], e["detail"]) for e in ledger.history("p9")]
    finally:
        backend.close()
