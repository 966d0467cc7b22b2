"""The SQLite files' cross-process write lock (``storage.sqlite.write_lock``).

Two real processes write one file as hard as they can, each through a group-commit writer
(its inline path and its writer thread) and a one-connection store, with SQLite's busy
timeout at 1 ms: without the lock the second writer to find SQLite's lock taken gives up
("database is locked") within a few writes; with it every writer queues in the kernel and
never meets SQLite's lock, and every row of both processes is there. And a group-commit
writer that waited for the lock commits what queued meanwhile in the same transaction.
"""

from __future__ import annotations

import concurrent.futures
import fcntl
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path

from storage.sqlite import files
from storage.sqlite.write_lock import SUFFIX, WriteLock
from storage.sqlite.writer import GroupCommitWriter

REPO = Path(__file__).resolve().parents[2]
ROWS = 200  # per writer and process

CHILD = textwrap.dedent(
    """
    import sys
    from concurrent.futures import ThreadPoolExecutor

    from storage.sqlite import files
    from storage.sqlite.one_connection import OneConnectionStore
    from storage.sqlite.writer import GroupCommitWriter

    path, proc, rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ddl = (
        "CREATE TABLE IF NOT EXISTS t"
        " (proc TEXT, via TEXT, n INTEGER, PRIMARY KEY (proc, via, n))"
    )
    spec = files.SqliteFile(
        path, "test", None, 0, files.FileErrors(RuntimeError, RuntimeError), busy_timeout_ms=1
    )

    def open_writer():
        conn = files.connect(spec)
        conn.execute(ddl)
        return conn

    writer = GroupCommitWriter(
        spec.path, open_writer, context=lambda conn: conn, unavailable=RuntimeError
    )
    store = OneConnectionStore(spec, ddl, RuntimeError)

    def insert(via, n):
        return lambda conn: conn.execute("INSERT INTO t VALUES (?, ?, ?)", (proc, via, n))

    def by_store(n):
        with store._tx() as conn:
            insert("store", n)(conn)

    print("ready", flush=True)
    sys.stdin.readline()  # both processes write from the same moment on
    with ThreadPoolExecutor(4) as pool:
        queued = [
            pool.submit(writer.write, insert("thread", n), durable=False) for n in range(rows)
        ]
        stored = [pool.submit(by_store, n) for n in range(rows)]
        for n in range(rows):
            writer.write(insert("inline", n), durable=n % 10 == 0)
        for fut in queued + stored:
            fut.result()
    writer.close()
    store.close()
    print("done", flush=True)
    """
)


def _start(path: Path, proc: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), proc, str(ROWS)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )


def test_two_processes_writers_queue_on_the_lock_not_in_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    procs = [_start(path, "a")]
    assert procs[0].stdout is not None and procs[0].stdout.readline() == "ready\n"
    procs.append(_start(path, "b"))  # the file and its table exist: no start-up writes race
    assert procs[1].stdout is not None and procs[1].stdout.readline() == "ready\n"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert out == "done\n"

    with sqlite3.connect(path) as conn:
        rows = set(conn.execute("SELECT proc, via, n FROM t"))
    expected = {
        (proc, via, n)
        for proc in ("a", "b")
        for via in ("thread", "store", "inline")
        for n in range(ROWS)
    }
    assert rows == expected


def _free(path: Path) -> bool:
    """Whether another open file of ``path``'s lock could take it now."""
    fd = os.open(str(path) + SUFFIX, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def test_held_from_enter_to_exit_and_let_go_on_close(tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    lock = WriteLock(str(db))
    assert (db.parent / ("x.db" + SUFFIX)).stat().st_mode & 0o777 == 0o600
    with lock:
        assert not _free(db)
    assert _free(db)
    lock.__enter__()
    lock.close()  # a closed lock file holds nothing
    assert _free(db)


def test_a_thread_holding_the_lock_does_not_wait_for_itself(tmp_path: Path) -> None:
    db = str(tmp_path / "x.db")
    outer, inner = WriteLock(db), WriteLock(db)
    finished = threading.Event()

    def nested() -> None:
        with outer, inner:  # a second connection's write inside the first's
            pass
        finished.set()

    thread = threading.Thread(target=nested, daemon=True)
    thread.start()
    thread.join(timeout=30)
    assert finished.is_set()
    assert _free(Path(db))  # the outer block let it go; the inner never took it


def test_another_thread_waits_until_it_is_let_go(tmp_path: Path) -> None:
    db = str(tmp_path / "x.db")
    first, second = WriteLock(db), WriteLock(db)
    order: list[str] = []
    taken = threading.Event()

    def other() -> None:
        taken.wait()
        with second:
            order.append("second")

    thread = threading.Thread(target=other, daemon=True)
    with first:
        thread.start()
        taken.set()
        # The other thread cannot get in before this block ends, however long it runs.
        assert not _free(Path(db))
        order.append("first")
    thread.join(timeout=30)
    assert order == ["first", "second"]


def test_no_lock_file_possible_means_sqlite_lock_alone(tmp_path: Path) -> None:
    lock = WriteLock(str(tmp_path / "missing-dir" / "x.db"))
    with lock:  # nothing to take: SQLite's own lock and busy timeout decide
        pass
    lock.close()


def test_what_queued_while_the_lock_was_waited_for_joins_the_commit(tmp_path: Path) -> None:
    path = tmp_path / "join.db"
    spec = files.SqliteFile(str(path), "test", None, 0, files.FileErrors(OSError, OSError))

    def open_conn() -> sqlite3.Connection:
        conn = files.connect(spec)
        conn.execute("CREATE TABLE t (n INTEGER)")
        return conn

    writer = GroupCommitWriter(
        spec.path, open_conn, context=lambda conn: conn, unavailable=RuntimeError
    )
    ran: list[int] = []

    def op(n: int) -> Callable[[sqlite3.Connection], None]:
        def run(conn: sqlite3.Connection) -> None:
            ran.append(n)
            conn.execute("INSERT INTO t VALUES (?)", (n,))

        return run

    other_process = WriteLock(spec.path)  # another process's writer, mid-commit
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        with other_process:
            first = pool.submit(writer.write, op(0))  # taken, then waits for the lock
            while writer._queue.pending or not writer._busy:
                threading.Event().wait(0.001)
            later = [writer.submit(op(n)) for n in range(1, 5)]  # queued behind it
            assert not first.done()
        first.result()
        for fut in later:
            fut.result()
        assert ran == [0, 1, 2, 3, 4]  # in the order submitted
        assert writer.commits == 1  # one transaction, one fsync, for all five
    finally:
        other_process.close()
        pool.shutdown()
        writer.close()
