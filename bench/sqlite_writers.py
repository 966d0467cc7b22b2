"""Several processes writing one SQLite file: writes/s, durable commits/s and write latency,
with and without the cross-process write lock (``storage.sqlite.write_lock``).

Each process is what one `reveille serve --workers N` worker is to a store file: one
group-commit writer (``storage.sqlite.writer``) at ``synchronous=FULL``, its callers
``--threads`` threads that each write one small row after another (a turn's durable commit)
for ``--seconds``. Every configuration runs on a fresh file, all in one run:
1, 2 and 4 processes (``--procs``), each with the lock (as Reveille runs) and without it
(the writer's lock replaced by a no-op in the child, and its joining of what queued while
it waited for the lock: SQLite's sleep-and-poll busy handler alone, the writer as it was
before the lock existed). Printed per configuration: writes/s over all processes,
durable commits/s (each one fsync of the log) and writes per commit, p50/p99 of one write's
latency; then each configuration against one process with the lock.

Usage: python bench/sqlite_writers.py [--procs 1,2,4] [--threads 8] [--seconds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def child(path: str, seconds: float, threads: int, lock: bool) -> None:
    """One writing process: prints ready, waits for a line on stdin, writes, prints JSON."""
    from storage.sqlite import files, writer

    if not lock:

        class NoLock:
            def __init__(self, path: str) -> None:
                pass

            def __enter__(self) -> NoLock:
                return self

            def __exit__(self, *exc: object) -> None:
                pass

            def close(self) -> None:
                pass

        writer.WriteLock = NoLock  # type: ignore[misc, assignment]
        # Nor the joining of what queued while the lock was waited for: the writer as it was.
        writer.GroupCommitWriter._joined = lambda self, live, durable: (live, durable)  # type: ignore[method-assign]

    spec = files.SqliteFile(path, "bench", None, 0, files.FileErrors(RuntimeError, RuntimeError))
    ddl = "CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, body TEXT)"

    def open_conn() -> object:
        conn = files.connect(spec)
        conn.execute(ddl)
        return conn

    w = writer.GroupCommitWriter(
        spec.path,
        open_conn,  # type: ignore[arg-type]
        context=lambda conn: conn,
        unavailable=RuntimeError,
    )
    print("ready", flush=True)
    sys.stdin.readline()
    latencies: list[float] = []
    errors = [0]
    mu = threading.Lock()
    deadline = time.monotonic() + seconds

    def loop() -> None:
        mine: list[float] = []
        body = "x" * 200
        while time.monotonic() < deadline:
            start = time.perf_counter()
            try:
                w.write(lambda conn: conn.execute("INSERT INTO t (body) VALUES (?)", (body,)))
            except RuntimeError:
                with mu:
                    errors[0] += 1
                continue
            mine.append(time.perf_counter() - start)
        with mu:
            latencies.extend(mine)

    workers = [threading.Thread(target=loop) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    out = {
        "writes": len(latencies),
        "errors": errors[0],
        "commits": w.commits,
        "durable_commits": w.durable_commits,
        "latencies": latencies,
    }
    w.close()
    print(json.dumps(out), flush=True)


def run(procs: int, lock: bool, args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "bench.db")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        cmd = [sys.executable, __file__, "--child", path, str(args.seconds), str(args.threads)]
        cmd.append("1" if lock else "0")
        started = []
        for _ in range(procs):  # one after the other: the file's creation never races
            p = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
            )
            assert p.stdout is not None and p.stdout.readline() == "ready\n"
            started.append(p)
        for p in started:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        results = [json.loads(p.communicate()[0]) for p in started]
    lat = sorted(x for r in results for x in r["latencies"])
    writes = sum(r["writes"] for r in results)
    durable = sum(r["durable_commits"] for r in results)
    return {
        "wps": writes / args.seconds,
        "cps": durable / args.seconds,
        "per_commit": writes / max(durable, 1),
        "p50": statistics.median(lat) * 1000 if lat else 0.0,
        "p99": lat[int(len(lat) * 0.99)] * 1000 if lat else 0.0,
        "errors": sum(r["errors"] for r in results),
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1")
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", default="1,2,4")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    counts = [int(x) for x in args.procs.split(",")]
    print(
        f"{args.threads} writing threads per process, {args.seconds:g} s each, "
        f"durable (synchronous=FULL) commits, {os.cpu_count()} cores"
    )
    figures: dict[tuple[int, bool], dict[str, float]] = {}
    for procs in counts:
        for lock in (True, False):
            f = figures[procs, lock] = run(procs, lock, args)
            name = f"{procs} process{'es' if procs > 1 else ''}, {'flock  ' if lock else 'no lock'}"
            print(
                f"{name:<22}: {f['wps']:8,.0f} writes/s  {f['cps']:7,.0f} durable commits/s "
                f"({f['per_commit']:5.1f} writes each)  p50 {f['p50']:6.2f} ms  "
                f"p99 {f['p99']:7.2f} ms  ({f['errors']:.0f} errors)"
            )
    first = figures[counts[0], True]
    for (procs, lock), f in figures.items():
        name = f"{procs} process{'es' if procs > 1 else ''}, {'flock  ' if lock else 'no lock'}"
        print(
            f"ratio, {name:<15}: {f['wps'] / first['wps']:.2f}x writes/s, "
            f"p99 {f['p99'] / first['p99']:.2f}x of {counts[0]} with the lock"
        )


if __name__ == "__main__":
    main()
