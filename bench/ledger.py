"""End-to-end ledger benchmark: dispatch -> worker -> terminal row -> queue -> claim -> ack.

Prints, for one run on this machine:
  * pipeline items/s for N items through the real ``tools.async_delegation`` path
    (four durable writes per item at synchronous=FULL, group-committed);
  * a raw-sqlite3 baseline doing the same four writes per item unbatched, same durability;
  * their ratio;
  * fsyncs per delivered item, counted by strace when available (else commits counted by
    the writer, each of which is one fsync of the log at synchronous=FULL);
  * p50/p99 enqueue-to-ack latency at a steady offered load.

Usage: python bench/ledger.py [--items 20000] [--rate 500] [--seconds 6]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools import async_delegation as ad
from tools.process_registry import CompletionQueue

_DONE = {"status": "completed", "summary": "ok"}


def _runner() -> dict:
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

    async def _handle(self, evt: dict) -> None:
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
        tasks: set[asyncio.Task] = set()
        while not self.done.is_set():
            try:
                evt = await asyncio.wait_for(self.queue.get_async(), timeout=1.0)
            except TimeoutError:
                continue
            task = asyncio.create_task(self._handle(evt))
            tasks.add(task)
            task.add_done_callback(tasks.discard)


def pipeline(path: str, items: int, producers: int) -> dict:
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
    stats = rt.ledger.backend.stats()
    delivered = len(rt.ledger.list(delivery_state="delivered", limit=items * 2))
    ad.reset_runtime()
    return {
        "items": per * producers,
        "delivered": delivered,
        "seconds": elapsed,
        "items_per_s": delivered / elapsed,
        "commits": stats["commits"],
        "operations": stats["operations"],
    }


def latency(path: str, rate: float, seconds: float) -> dict:
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
    ad.reset_runtime()
    lat = sorted(v * 1000 for v in stamps.values() if v < 1000)  # seconds -> ms, acked only
    q = statistics.quantiles(lat, n=100)
    return {"offered_per_s": rate, "acked": len(lat), "p50_ms": q[49], "p99_ms": q[98]}


def baseline(path: str, items: int) -> dict:
    """The same four writes per item, each its own transaction, synchronous=FULL."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute(
        "CREATE TABLE d (id TEXT PRIMARY KEY, state TEXT, delivery_state TEXT, event TEXT, "
        "claim_token TEXT, attempts INTEGER, created_at REAL, completed_at REAL) WITHOUT ROWID"
    )
    event = json.dumps({"type": "async_delegation", "status": "completed", "summary": "ok"})
    start = time.perf_counter()
    for i in range(items):
        rid = f"deleg_{i:08x}"
        now = time.time()
        conn.execute(
            "INSERT INTO d VALUES (?, 'running', 'pending', NULL, NULL, 0, ?, NULL)", (rid, now)
        )
        conn.execute(
            "UPDATE d SET state='completed', event=?, completed_at=? "
            "WHERE id=? AND state='running'",
            (event, now, rid),
        )
        conn.execute(
            "UPDATE d SET claim_token=?, attempts=attempts+1 WHERE id=? "
            "AND delivery_state='pending' AND claim_token IS NULL",
            (f"tok{i}", rid),
        )
        conn.execute(
            "UPDATE d SET delivery_state='delivered' WHERE id=? AND claim_token=?",
            (rid, f"tok{i}"),
        )
    elapsed = time.perf_counter() - start
    conn.close()
    return {"items": items, "seconds": elapsed, "items_per_s": items / elapsed}


def count_fsyncs(items: int, producers: int) -> dict | None:
    """Re-run the pipeline under ``strace -c`` and count fsync/fdatasync calls."""
    strace = shutil.which("strace")
    if strace is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            strace,
            "-f",
            "--seccomp-bpf",
            "-qq",
            "-c",
            "-e",
            "trace=fsync,fdatasync",
            "-o",
            f"{tmp}/strace.txt",
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
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            print(proc.stderr, file=sys.stderr)
            return None
        text = Path(f"{tmp}/strace.txt").read_text()
        calls = sum(
            int(m.group(1))
            for m in re.finditer(
                r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?"
                r"(?:fsync|fdatasync)\s*$",
                text,
                re.M,
            )
        )
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        return {"fsyncs": calls, "delivered": result["delivered"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--items", type=int, default=20_000)
    ap.add_argument("--baseline-items", type=int, default=4_000)
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--rate", type=float, default=500.0)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--pipeline-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.pipeline_only:
        print(json.dumps(pipeline(f"{args.dir}/ledger.db", args.items, args.producers)))
        return

    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        pipe = pipeline(f"{tmp}/pipeline.db", args.items, args.producers)
        base = baseline(f"{tmp}/baseline.db", args.baseline_items)
        lat = latency(f"{tmp}/latency.db", args.rate, args.seconds)
    fsync = count_fsyncs(args.items, args.producers)

    print(f"sqlite {sqlite3.sqlite_version}, synchronous=FULL, WAL, {os.cpu_count()} cores")
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
    print(
        f"commits    : {pipe['commits']} for {pipe['operations']} operations = "
        f"{pipe['commits'] / max(pipe['delivered'], 1):.3f} log commits per delivered item"
    )
    if fsync:
        print(
            f"fsyncs     : {fsync['fsyncs']} for {fsync['delivered']} delivered items = "
            f"{fsync['fsyncs'] / max(fsync['delivered'], 1):.3f} per item (strace)"
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
