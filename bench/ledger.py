"""End-to-end ledger benchmark: dispatch -> worker -> terminal row -> queue -> claim -> ack.

Prints, for one run on this machine:
  * pipeline items/s for N items through the real ``tools.async_delegation`` path
    (four durable writes per item at synchronous=FULL, group-committed);
  * a raw-sqlite3 baseline doing the same four writes per item unbatched, same durability;
  * their ratio;
  * fsyncs per delivered item, counted by strace when available (else commits counted by
    the writer, each of which is one fsync of the log at synchronous=FULL);
  * p50/p99 enqueue-to-ack latency at a steady offered load;
  * the sequential pattern of a gateway watcher (dispatch, wait for the completion, claim,
    acknowledge; one item at a time), and the same with every write waiting for the disk;
  * what the disk allows that pattern: the median durable commit, and the ceiling of two
    such commits per item;
  * the same ratio measured interleaved, and where an item's time goes (its commits, CPU
    outside them, waiting for threads to run): blocks of the sequential pattern alternate with
    blocks of bare durable commits on the same disk, each block's items against twice the
    median commit of the commits next to it, and the median of those ratios. On a disk that
    others share, the speed of an fsync drifts by several times within seconds; a ceiling
    measured seconds apart from the pattern then says more about the drift than about the
    pattern, and the interleaved ratio does not;
  * interleaved too, the two durable commits alone (the row, the terminal row) on a file
    with the ledger's whole schema (its indexes, the goals' text index): what the schema,
    apart from the code around the commits, costs the disk per item;
  * the pages the pattern writes into the log per item (each one is fsynced by one of the
    item's two durable commits), split by the commits that wrote them: the frames the
    write-ahead log grows by, with automatic checkpoints off for the count.

Usage: python bench/ledger.py [--items 20000] [--sequential-items 5000] [--rate 500]
                              [--seconds 6] [--sequential-only] [--collector server|default]

The process's garbage collector is set as `reveille serve` sets it once started
(``reveille.collector``); ``--collector default`` leaves CPython's, for comparison.

``--sequential-only`` runs and prints only the sequential pattern's lines (sequential, seq
FULL, seq ratio, disk, seq floor, interleaved, schema, per item, pages).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import server_gc

from delivery.rows import RowQuery
from storage.sqlite.ledger import _SCHEMA as LEDGER_SCHEMA
from storage.sqlite.ledger import GOALS_INDEX, RETENTION_SCHEMA
from tools import async_delegation as ad
from tools.process_registry import CompletionQueue

_DONE = {"status": "completed", "summary": "ok"}


def _runner() -> dict[str, Any]:
    return _DONE


class Consumer:
    """An asyncio consumer like the gateway's watcher: claim, hand off, acknowledge.

    Each event is handled in its own task, so claims and acknowledgements of many events
    are in flight at once and share the ledger's group commits.
    """

    def __init__(self, queue: CompletionQueue, expected: int, stamps: dict[str, float]) -> None:
        self.queue = queue
        self.expected = expected
        self.stamps = stamps
        self.acked = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _handle(self, evt: dict[str, Any]) -> None:
        claim = await ad.aclaim_event_delivery(evt, "bench")
        if not claim:
            return
        await ad.acomplete_event_delivery(evt, claim)
        start = self.stamps.get(evt["delegation_id"])
        if start is not None:
            self.stamps[evt["delegation_id"]] = time.perf_counter() - start
        self.acked += 1
        if self.acked >= self.expected:
            self.done.set()

    async def _main(self) -> None:
        tasks: set[asyncio.Task[None]] = set()
        while not self.done.is_set():
            evt = await self.queue.get_async()
            if evt is None:  # the pipeline's stop signal
                break
            task = asyncio.create_task(self._handle(evt))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)

    def stop(self) -> None:
        self.queue.put(None)  # type: ignore[arg-type]
        self.thread.join(timeout=30)


def pipeline(path: str, items: int, producers: int) -> dict[str, Any]:
    queue = CompletionQueue()
    rt = ad.configure_runtime(path, completion_queue=queue, max_queued=items)
    consumer = Consumer(queue, items - items % producers, {})
    consumer.thread.start()
    per = items // producers

    def produce() -> None:
        for _ in range(per):
            r = ad.dispatch_async_delegation(
                goal="bench", runner=_runner, session_key="bench", max_async_children=64
            )
            if r["status"] == "rejected":
                raise RuntimeError(r["error"])

    start = time.perf_counter()
    prods = [threading.Thread(target=produce) for _ in range(producers)]
    for t in prods:
        t.start()
    for t in prods:
        t.join()
    consumer.done.wait(timeout=120)
    elapsed = time.perf_counter() - start
    consumer.stop()
    stats = rt.ledger.backend.stats()
    delivered = len(rt.ledger.query(RowQuery(delivery_state="delivered", limit=items * 2)))
    ad.reset_runtime()
    return {
        "items": per * producers,
        "delivered": delivered,
        "seconds": elapsed,
        "items_per_s": delivered / elapsed,
        "commits": stats["commits"],
        "operations": stats["operations"],
    }


def _one_item(queue: Any) -> bool:
    """One item of the sequential pattern: dispatch a delegation, wait for its completion
    event, claim it, acknowledge it; whether it was delivered."""
    r = ad.dispatch_async_delegation(
        goal="bench", runner=_runner, session_key="bench", max_async_children=3
    )
    if r["status"] == "rejected":
        raise RuntimeError(r["error"])
    evt = queue.get(timeout=30)
    claim = ad.claim_event_delivery(evt, "bench")
    return bool(claim and ad.complete_event_delivery(evt, claim))


def sequential(path: str, items: int, *, all_durable: bool = False) -> dict[str, Any]:
    """The synchronous contract used the way a gateway watcher uses it, one item at a time.

    Dispatch one delegation (at most 3 running), wait for its completion event on the
    queue, claim it, acknowledge it; then the next. Nothing overlaps, so every write waits
    for its own commit: the figure is the cost of one item's four commits end to end.
    ``all_durable`` makes every write wait for the disk (what the ledger did before claims
    and acknowledgements were allowed to commit at synchronous=NORMAL).
    """
    queue = CompletionQueue()
    rt = ad.configure_runtime(path, completion_queue=queue, max_queued=16)
    if all_durable:
        backend: Any = rt.ledger.backend
        plain_submit, plain_async = backend.submit, backend.submit_async
        backend.submit = lambda op, durable=True: plain_submit(op, durable=True)
        backend.submit_async = lambda op, durable=True: plain_async(op, durable=True)
    delivered = 0
    start = time.perf_counter()
    for _ in range(items):
        delivered += _one_item(queue)
    elapsed = time.perf_counter() - start
    stats = rt.ledger.backend.stats()
    ad.reset_runtime()
    return {
        "items": items,
        "delivered": delivered,
        "seconds": elapsed,
        "items_per_s": delivered / elapsed,
        "commits": stats["commits"],
        "durable_commits": stats.get("durable_commits", stats["commits"]),
    }


def durable_commit_floor(path: str, commits: int = 1_000) -> dict[str, Any]:
    """What the disk allows: the median time of one durable commit (a small row, WAL,
    synchronous=FULL, raw sqlite3, nothing else running). The sequential pattern needs two
    per item (the row before the work, the terminal row), so 1 / (2 x median) is its
    ceiling on this disk, however little else an item costs."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
    times = []
    for i in range(commits):
        start = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t (v) VALUES (?)", (f"row {i}",))
        conn.execute("COMMIT")
        times.append(time.perf_counter() - start)
    conn.close()
    median = statistics.median(times)
    return {"median_ms": median * 1000, "ceiling_per_s": 1 / (2 * median)}


class CommitClock:
    """Where a run's time goes: wraps the ledger writer's commit (one instance; the bench's
    own probe) to sum the wall time spent in durable and in NORMAL commits and the CPU the
    committing threads spent there."""

    def __init__(self, backend: Any) -> None:
        self.durable = self.normal = self.cpu = 0.0
        writer = backend._writer
        plain = writer._commit

        def commit(conn: Any, context: Any, batch: list[Any]) -> None:
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                plain(conn, context, batch)
            finally:
                wall = time.perf_counter() - wall
                self.cpu += time.thread_time() - cpu
                if any(durable for _, _, durable in batch):
                    self.durable += wall
                else:
                    self.normal += wall

        writer._commit = commit


def interleaved(path: str, items: int, *, block: int = 100) -> dict[str, Any]:
    """The sequential pattern against its ceiling, both measured in turns: ``block`` items of
    the pattern, then ``block`` bare durable commits (``durable_commit_floor``'s, on a file
    beside the ledger), and again. Each block of the pattern is set against twice the median
    commit of the bare blocks before and after it; the result is the median of those
    ratios (and the pattern's and the ceiling's items/s over the whole run).

    Also where an item's time goes (means over the pattern's blocks): its durable commits,
    its NORMAL commits, the process's CPU outside commits (every thread), and the rest, which
    is waiting for a thread to run: the two hand-offs (to the worker that runs the work and
    back to the consumer) and the wake-ups after each fsync."""
    queue = CompletionQueue()
    rt = ad.configure_runtime(path, completion_queue=queue, max_queued=16)
    clock = CommitClock(rt.ledger.backend)
    bare = sqlite3.connect(f"{path}-bare", isolation_level=None)
    bare.execute("PRAGMA journal_mode = WAL")
    bare.execute("PRAGMA synchronous = FULL")
    bare.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")

    # The two durable commits themselves, on a file with everything the ledger's file has
    # (its indexes, the goals' text index, incremental vacuum): what the schema costs the
    # disk, apart from the code around the commits.
    schema = sqlite3.connect(f"{path}-schema", isolation_level=None)
    schema.execute("PRAGMA auto_vacuum = INCREMENTAL")
    schema.execute("PRAGMA journal_mode = WAL")
    schema.execute("PRAGMA synchronous = FULL")
    schema.executescript(LEDGER_SCHEMA + RETENTION_SCHEMA + GOALS_INDEX.ddl)
    made = 0

    def commits() -> float:
        times = []
        for i in range(block):
            start = time.perf_counter()
            bare.execute("BEGIN IMMEDIATE")
            bare.execute("INSERT INTO t (v) VALUES (?)", (f"row {i}",))
            bare.execute("COMMIT")
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    def schema_items() -> float:
        nonlocal made
        times = []
        for _ in range(block):
            made += 1
            row, terminal, _, _ = _item_params(made, time.time())
            start = time.perf_counter()
            for sql, params in ((_ITEM_WRITES[0], row), (_ITEM_WRITES[1], terminal)):
                schema.execute("BEGIN IMMEDIATE")
                schema.execute(sql, params)
                schema.execute("COMMIT")
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    spent = {"wall": 0.0, "cpu": 0.0}

    def pattern() -> float:
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(block):
            if not _one_item(queue):
                raise RuntimeError("an item of the sequential pattern was not delivered")
        wall = time.perf_counter() - start
        spent["wall"] += wall
        spent["cpu"] += time.process_time() - cpu
        return wall / block

    medians, schema_medians = [commits()], [schema_items()]
    per_item = []
    for _ in range(max(items // block, 1)):
        per_item.append(pattern())
        medians.append(commits())
        schema_medians.append(schema_items())
    bare.close()
    schema.close()
    ad.reset_runtime()
    # Twice the mean of the two neighbouring medians, over the block's time per item.
    ratios = [
        (before + after) / item
        for item, before, after in zip(per_item, medians[:-1], medians[1:], strict=True)
    ]
    schema_ratios = [
        (before + after) / 2 / item
        for item, before, after in zip(
            per_item, schema_medians[:-1], schema_medians[1:], strict=True
        )
    ]
    n = len(per_item) * block
    outside_cpu = spent["cpu"] - clock.cpu
    return {
        "items": n,
        "blocks": len(per_item),
        "ratio": statistics.median(ratios),
        "items_per_s": 1 / statistics.mean(per_item),
        "ceiling_per_s": 1 / (2 * statistics.median(medians)),
        "schema_ratio": statistics.median(schema_ratios),
        "schema_ms": statistics.median(schema_medians) * 1000,
        "item_ms": spent["wall"] / n * 1000,
        "bare_ms": statistics.mean(medians) * 1000,
        "durable_ms": clock.durable / n * 1000,
        "normal_ms": clock.normal / n * 1000,
        "cpu_ms": outside_cpu / n * 1000,
        "wait_ms": (spent["wall"] - clock.durable - clock.normal - outside_cpu) / n * 1000,
    }


def pages_per_item(path: str, items: int, *, warmup: int = 200) -> dict[str, Any]:
    """The pages the sequential pattern writes into the log per item, counted as the frames
    the write-ahead log grows by (automatic checkpoints off, so that it only grows), after
    ``warmup`` items have given the file its first pages; split into the pages of durable
    commits and of NORMAL ones (whose pages the next durable commit's fsync flushes)."""
    queue = CompletionQueue()
    rt = ad.configure_runtime(path, completion_queue=queue, max_queued=16)
    writer = rt.ledger.backend._writer  # type: ignore[attr-defined]  # SQLite's writer
    writer._conn.execute("PRAGMA wal_autocheckpoint = 0")
    for _ in range(warmup):
        _one_item(queue)
    writer._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    frame = 24 + writer._conn.execute("PRAGMA page_size").fetchone()[0]
    wal = f"{path}-wal"
    grown = {True: 0, False: 0}
    plain = writer._commit

    def commit(conn: Any, context: Any, batch: list[Any]) -> None:
        before = os.path.getsize(wal)
        try:
            plain(conn, context, batch)
        finally:
            grown[any(durable for _, _, durable in batch)] += os.path.getsize(wal) - before

    writer._commit = commit
    for _ in range(items):
        if not _one_item(queue):
            raise RuntimeError("an item of the sequential pattern was not delivered")
    ad.reset_runtime()
    header = 32  # the log's own header, written once by the first commit after the reset
    durable = (grown[True] - header) / frame / items
    normal = grown[False] / frame / items
    return {"items": items, "pages": durable + normal, "durable": durable, "normal": normal}


def latency(path: str, rate: float, seconds: float) -> dict[str, Any]:
    queue = CompletionQueue()
    ad.configure_runtime(path, completion_queue=queue, max_queued=100_000)
    total = int(rate * seconds)
    stamps: dict[str, float] = {}
    consumer = Consumer(queue, total, stamps)
    consumer.thread.start()
    interval = 1.0 / rate
    begin = time.perf_counter()
    for i in range(total):
        target = begin + i * interval
        delay = target - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        t0 = time.perf_counter()
        r = ad.dispatch_async_delegation(goal="lat", runner=_runner, max_async_children=64)
        stamps.setdefault(r["delegation_id"], t0)
    consumer.done.wait(timeout=30)
    consumer.stop()
    ad.reset_runtime()
    lat = sorted(v * 1000 for v in stamps.values() if v < 1000)  # seconds -> ms, acked only
    q = statistics.quantiles(lat, n=100)
    return {"offered_per_s": rate, "acked": len(lat), "p50_ms": q[49], "p99_ms": q[98]}


_REQUEST = json.dumps({"type": "async_delegation", "goal": "bench", "session_key": "bench"})
_EVENT = json.dumps(
    {
        "type": "async_delegation",
        "goal": "bench",
        "status": "completed",
        "summary": "ok",
        "session_key": "bench",
    }
)
# An item's four writes, in order: the row before the work, the terminal row with its
# result, the claim, the acknowledgement.
_ITEM_WRITES = (
    (
        "INSERT INTO deliveries (id, kind, state, delivery_state, session_key, goal, request,"
        " owner, created_at, updated_at, started_at) VALUES"
        " (?, 'delegation', 'running', 'pending', 'bench', 'bench', ?, 'me', ?, ?, ?)"
    ),
    (
        "UPDATE deliveries SET state = 'completed', event = ?, request = NULL,"
        " completed_at = ?, replay_from = ?, holder = 'me', due_at = ?, updated_at = ?"
        " WHERE id = ? AND state = 'running' AND delivery_state = 'pending'"
    ),
    (
        "UPDATE deliveries SET claim_token = ?, claim_consumer = 'bench', claimed_at = ?,"
        " claim_expires_at = ?, due_at = ?, delivery_attempts = delivery_attempts + 1"
        " WHERE id = ? AND delivery_state = 'pending' AND claim_expires_at <= ?"
    ),
    (
        "UPDATE deliveries SET delivery_state = 'delivered', settled_at = ?, due_at = NULL,"
        " holder = NULL, claim_expires_at = 0 WHERE id = ? AND claim_token = ?"
        " AND delivery_state = 'pending'"
    ),
)


def _item_params(i: int, now: float) -> list[tuple[Any, ...]]:
    rid, token = f"deleg_{i:019x}", f"tok{i}"
    return [
        (rid, _REQUEST, now, now, now),
        (_EVENT, now, now, now + 300, now, rid),
        (token, now, now + 300, now + 300, rid, now),
        (now, rid, token),
    ]


def _raw_ledger(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.executescript(LEDGER_SCHEMA)
    return conn


def baseline(path: str, items: int) -> dict[str, Any]:
    """The same four writes per item on the same schema, each its own transaction.

    Plain sqlite3, one connection, WAL and synchronous=FULL like the ledger: what the
    pipeline would cost without group commit (one fsync per write).
    """
    conn = _raw_ledger(path)
    start = time.perf_counter()
    for i in range(items):
        for sql, params in zip(_ITEM_WRITES, _item_params(i, time.time()), strict=True):
            conn.execute(sql, params)
    elapsed = time.perf_counter() - start
    conn.close()
    return {"items": items, "seconds": elapsed, "items_per_s": items / elapsed}


def sequential_floor(path: str, items: int) -> dict[str, Any]:
    """What the sequential pattern cannot do without, and nothing else: each item's four
    writes on the ledger's own schema (its indexes too), one commit each, at the durability
    the pattern gives them (the row and the terminal row FULL, the claim and the
    acknowledgement NORMAL), the terminal write on a second thread handed the item through
    a queue and back (the work runs on a worker). Raw sqlite3; no rules, no events."""
    conn = _raw_ledger(path)
    level = "FULL"

    def commit(sql: str, params: tuple[Any, ...], durability: str) -> None:
        # One thread at a time uses the connection: the main thread waits for the worker.
        nonlocal level
        if durability != level:  # switched only when it changes, as the ledger's writer does
            conn.execute(f"PRAGMA synchronous = {durability}")
            level = durability
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(sql, params)
        conn.execute("COMMIT")

    to_worker: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
    done: queue.SimpleQueue[bool] = queue.SimpleQueue()

    def worker() -> None:
        while (params := to_worker.get()) is not None:
            commit(_ITEM_WRITES[1], params, "FULL")
            done.put(True)

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    start = time.perf_counter()
    for i in range(items):
        row, terminal, claim, ack = _item_params(i, time.time())
        commit(_ITEM_WRITES[0], row, "FULL")
        to_worker.put(terminal)
        done.get()
        commit(_ITEM_WRITES[2], claim, "NORMAL")
        commit(_ITEM_WRITES[3], ack, "NORMAL")
    elapsed = time.perf_counter() - start
    to_worker.put(None)
    thread.join()
    conn.close()
    return {"items": items, "seconds": elapsed, "items_per_s": items / elapsed}


def count_fsyncs(items: int, producers: int) -> dict[str, Any] | None:
    """Re-run the pipeline with every fsync/fdatasync counted.

    A tiny LD_PRELOAD library (bench/fsync_counter.c, built with the C compiler) counts the
    calls without slowing the run; without a compiler, ``strace -c`` counts them instead,
    but tracing slows the run, so batches shrink and the figure is pessimistic.
    """
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable,
            __file__,
            "--pipeline-only",
            "--items",
            str(items),
            "--producers",
            str(producers),
            "--dir",
            tmp,
        ]
        env = dict(os.environ)
        cc = shutil.which("cc") or shutil.which("gcc")
        method = "LD_PRELOAD counter"
        if cc:
            lib = f"{tmp}/fsync_counter.so"
            src = Path(__file__).with_name("fsync_counter.c")
            subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", lib, str(src), "-ldl"], check=True)
            env["LD_PRELOAD"] = lib
            cmd.append("--report-fsyncs")
        elif shutil.which("strace"):
            method = "strace -c"
            cmd = [
                "strace",
                "-f",
                "--seccomp-bpf",
                "-qq",
                "-c",
                "-e",
                "trace=fsync,fdatasync",
                "-o",
                f"{tmp}/strace.txt",
                *cmd,
            ]
        else:
            return None
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
        if proc.returncode != 0:
            print(proc.stderr, file=sys.stderr)
            return None
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        if method == "strace -c":
            text = Path(f"{tmp}/strace.txt").read_text()
            result["fsyncs"] = sum(
                int(m.group(1))
                for m in re.finditer(
                    r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?"
                    r"(?:fsync|fdatasync)\s*$",
                    text,
                    re.M,
                )
            )
        result["method"] = method
        return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--items", type=int, default=20_000)
    ap.add_argument("--baseline-items", type=int, default=4_000)
    ap.add_argument("--producers", type=int, default=16)
    ap.add_argument("--sequential-items", type=int, default=5_000)
    ap.add_argument("--rate", type=float, default=500.0)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument(
        "--sequential-only", action="store_true", help="only the sequential pattern's lines"
    )
    server_gc.add_option(ap)
    ap.add_argument("--pipeline-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    ap.add_argument("--report-fsyncs", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    server_gc.apply(args)

    if args.pipeline_only:
        result = pipeline(f"{args.dir}/ledger.db", args.items, args.producers)
        if args.report_fsyncs:
            import ctypes

            result["fsyncs"] = ctypes.CDLL(None).reveille_fsync_calls()
        print(json.dumps(result))
        return

    seq_only = args.sequential_only
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        if not seq_only:
            pipe = pipeline(f"{tmp}/pipeline.db", args.items, args.producers)
            base = baseline(f"{tmp}/baseline.db", args.baseline_items)
        seq_full = sequential(f"{tmp}/seq-full.db", args.sequential_items, all_durable=True)
        seq = sequential(f"{tmp}/seq.db", args.sequential_items)
        if not seq_only:
            lat = latency(f"{tmp}/latency.db", args.rate, args.seconds)
        floor = durable_commit_floor(f"{tmp}/floor.db")
        seq_floor = sequential_floor(f"{tmp}/seq-floor.db", args.sequential_items)
        mixed = interleaved(f"{tmp}/interleaved.db", args.sequential_items)
        pages = pages_per_item(f"{tmp}/pages.db", min(args.sequential_items, 1_000))
    fsync = None if seq_only else count_fsyncs(args.items, args.producers)

    print(f"sqlite {sqlite3.sqlite_version}, synchronous=FULL, WAL, {os.cpu_count()} cores")
    if not seq_only:
        print(
            f"pipeline   : {pipe['delivered']:>6} items delivered in {pipe['seconds']:.2f} s = "
            f"{pipe['items_per_s']:,.0f} items/s  ({args.producers} producers, "
            "1 asyncio consumer)"
        )
        print(
            f"baseline   : {base['items']:>6} items (4 unbatched commits each) in "
            f"{base['seconds']:.2f} s = {base['items_per_s']:,.0f} items/s"
        )
        print(f"ratio      : {pipe['items_per_s'] / base['items_per_s']:.1f}x the baseline")
    for label, run in (("sequential", seq), ("seq, FULL ", seq_full)):
        print(
            f"{label} : {run['delivered']:>6} items one at a time in {run['seconds']:.2f} s = "
            f"{run['items_per_s']:,.0f} items/s  ({run['durable_commits']} of "
            f"{run['commits']} commits waited for the disk)"
        )
    print(
        f"seq ratio  : {seq['items_per_s'] / seq_full['items_per_s']:.1f}x with claims and "
        "acknowledgements at synchronous=NORMAL"
    )
    print(
        f"disk       : one durable commit takes {floor['median_ms']:.3f} ms (median, raw "
        f"sqlite3): two per item cap the sequential pattern at {floor['ceiling_per_s']:,.0f} "
        f"items/s here; it reaches {seq['items_per_s'] / floor['ceiling_per_s']:.0%} of that"
    )
    print(
        f"seq floor  : the pattern's own four commits (2 FULL, 2 NORMAL) on the ledger's schema "
        f"and its one hand-off to a worker, raw sqlite3: {seq_floor['items_per_s']:,.0f} "
        f"items/s; the pattern reaches {seq['items_per_s'] / seq_floor['items_per_s']:.0%} of it"
    )
    print(
        f"interleaved: {mixed['items']} items in {mixed['blocks']} blocks, each beside bare "
        f"durable commits: the pattern {mixed['items_per_s']:,.0f} items/s, the ceiling "
        f"{mixed['ceiling_per_s']:,.0f}; block by block it reaches {mixed['ratio']:.0%} of "
        "the ceiling (median)"
    )
    print(
        f"schema     : the two durable commits alone (the row, the terminal row) on a file with "
        f"the ledger's whole schema, raw sqlite3, interleaved too: {mixed['schema_ms']:.3f} ms "
        f"per item (median); block by block the pattern reaches {mixed['schema_ratio']:.0%} "
        "of that"
    )
    print(
        f"per item   : {mixed['item_ms']:.3f} ms = durable commits {mixed['durable_ms']:.3f} "
        f"(two bare ones beside them: {2 * mixed['bare_ms']:.3f}) + NORMAL commits "
        f"{mixed['normal_ms']:.3f} + CPU outside commits {mixed['cpu_ms']:.3f} + waiting for "
        f"a thread to run (hand-offs, wake-ups) {mixed['wait_ms']:.3f}"
    )
    print(
        f"pages      : {pages['pages']:.1f} pages written into the log per item "
        f"({pages['items']} items; {pages['durable']:.1f} by its two durable commits, "
        f"{pages['normal']:.1f} by its NORMAL commits, fsynced by the next durable one)"
    )
    if seq_only:
        return
    print(
        f"commits    : {pipe['commits']} for {pipe['operations']} operations = "
        f"{pipe['commits'] / max(pipe['delivered'], 1):.3f} log commits per delivered item"
    )
    if fsync:
        print(
            f"fsyncs     : {fsync['fsyncs']} for {fsync['delivered']} delivered items = "
            f"{fsync['fsyncs'] / max(fsync['delivered'], 1):.3f} per item ({fsync['method']}, "
            f"a separate run at {fsync['items_per_s']:,.0f} items/s)"
        )
    else:
        print("fsyncs     : strace not available; see commits above (1 fsync each)")
    print(
        f"latency    : offered {lat['offered_per_s']:.0f} items/s for {args.seconds:.0f} s, "
        f"{lat['acked']} acked: enqueue-to-ack p50 {lat['p50_ms']:.2f} ms, "
        f"p99 {lat['p99_ms']:.2f} ms"
    )


if __name__ == "__main__":
    main()
