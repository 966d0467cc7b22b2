"""PostgreSQL ledger benchmark: several processes on one database at synchronous_commit=on.

Each item goes through the ledger's pipeline: the row written before the work (durable),
the terminal row with its event (durable), a claim and its acknowledgement (each a
compare-and-set; not durable: at most a redelivery the sinks absorb). Prints, for one run:

  * throughput: items/s with P processes x T threads issuing items back to back, for each
    T given (the items in flight at once are P x T);
  * latency: p50/p99 enqueue-to-ack at a steady offered rate (open loop: a late item's
    wait counts), also over P processes, with the first T;
  * baseline: the same four writes per item from the same P processes x T threads, each
    its own autocommit statement and so its own commit (one WAL flush each), no batching;
    at each T for which the server takes P x T more connections.

Usage: python bench/ledger_pg.py [--url postgresql://...] [--procs 4]
                                 [--threads 16,32,64,128] [--seconds 5] [--rate 1000]
The url defaults to REVEILLE_TEST_PG_URL; each run gets a fresh schema (no run inherits
another's dead rows), dropped after it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import secrets
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg

import storage
from delivery.ledger import Ledger

EVENT = {"type": "async_delegation", "status": "completed", "summary": "x" * 200}


def _schema_url(base: str, schema: str) -> str:
    sep = "&" if "?" in base else "?"
    options = f"-csearch_path={schema} -csynchronous_commit=on"
    return f"{base}{sep}options={quote(options)}"


def _item(ledger: Ledger, row_id: str) -> None:
    ledger.create(row_id, kind="delegation", state="running", session_key="bench")
    ledger.finish(row_id, expected="running", state="completed", event=EVENT)
    token = ledger.claim(row_id, "bench")
    assert token is not None
    assert ledger.complete(row_id, token)


def _baseline_item(conn: psycopg.Connection[Any], row_id: str) -> None:
    now = time.time()
    conn.execute(
        "INSERT INTO deliveries (id, kind, state, delivery_state, session_key, request, owner,"
        " created_at, updated_at, started_at) VALUES (%s, 'delegation', 'running', 'pending',"
        " 'bench', '{}', 'me', %s, %s, %s)",
        (row_id, now, now, now),
    )
    conn.execute(
        "UPDATE deliveries SET state = 'completed', event = %s, request = NULL, updated_at = %s,"
        " completed_at = %s, replay_from = %s, holder = 'me', due_at = %s"
        " WHERE id = %s AND state = 'running' AND delivery_state = 'pending'",
        (json.dumps(EVENT), now, now, now, now + 300, row_id),
    )
    token = secrets.token_hex(16)
    cur = conn.execute(
        "UPDATE deliveries SET claim_token = %s, claim_consumer = 'bench', claimed_at = %s,"
        " claim_expires_at = %s, delivery_attempts = delivery_attempts + 1"
        " WHERE id = %s AND delivery_state = 'pending' AND claim_expires_at <= %s",
        (token, now, now + 300, row_id, now),
    )
    assert cur.rowcount == 1
    cur = conn.execute(
        "UPDATE deliveries SET delivery_state = 'delivered', settled_at = %s, due_at = NULL"
        " WHERE id = %s AND claim_token = %s AND delivery_state = 'pending'",
        (now, row_id, token),
    )
    assert cur.rowcount == 1


def _worker(args: tuple[str, str, int, int, float, float, Any]) -> dict[str, Any]:
    mode, url, proc, threads, seconds, rate, start_at = args
    lat: list[float] = []
    done = [0]
    lock = threading.Lock()
    writers = int(os.environ.get("BENCH_WRITERS", "1"))
    ledger = (
        None
        if mode == "baseline"
        else Ledger(storage.open_storage(url).open_ledger(writers=writers))
    )
    conns = (
        [psycopg.connect(url, autocommit=True) for _ in range(threads)]
        if mode == "baseline"
        else []
    )
    while time.time() < start_at:
        time.sleep(0.001)
    end = start_at + seconds

    def run(t: int) -> None:
        n = 0
        interval = threads / rate if mode == "latency" else 0.0
        next_at = start_at + (t / threads) * interval
        mine: list[float] = []
        while True:
            if mode == "latency":
                if next_at >= end:
                    break
                delay = next_at - time.time()
                if delay > 0:
                    time.sleep(delay)
                t0 = next_at
                next_at += interval
            else:
                t0 = time.time()
                if t0 >= end:
                    break
            row_id = f"{mode[0]}{proc}-t{t}-{n}"
            n += 1
            if mode == "baseline":
                _baseline_item(conns[t], row_id)
            else:
                assert ledger is not None
                _item(ledger, row_id)
            mine.append(time.time() - t0)
        with lock:
            lat.extend(mine)
            done[0] += n

    ts = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    finished = time.time()
    stats = ledger.backend.stats() if ledger is not None else {}
    if ledger is not None:
        ledger.close()
    for c in conns:
        c.close()
    return {"items": done[0], "lat": lat, "elapsed": finished - start_at, "stats": stats}


def _run(
    mode: str, base_url: str, procs: int, threads: int, seconds: float, rate: float
) -> dict[str, Any]:
    schema = f"bench_{secrets.token_hex(4)}"
    with psycopg.connect(base_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    url = _schema_url(base_url, schema)
    try:
        storage.open_storage(url)  # migrates the fresh schema
        return _run_on(mode, url, procs, threads, seconds, rate)
    finally:
        with psycopg.connect(base_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def _run_on(
    mode: str, url: str, procs: int, threads: int, seconds: float, rate: float
) -> dict[str, Any]:
    start_at = time.time() + 1.5  # every process connected before the clock starts
    per_proc_rate = rate / procs
    with mp.get_context("spawn").Pool(procs) as pool:
        results = pool.map(
            _worker,
            [(mode, url, p, threads, seconds, per_proc_rate, start_at) for p in range(procs)],
        )
    items = sum(r["items"] for r in results)
    elapsed = max(r["elapsed"] for r in results)
    lat = sorted(x for r in results for x in r["lat"])
    commits = sum(r["stats"].get("commits", 0) for r in results)
    return {
        "items_per_s": items / elapsed,
        "items": items,
        "p50_ms": statistics.median(lat) * 1000 if lat else float("nan"),
        "p99_ms": lat[int(len(lat) * 0.99) - 1] * 1000 if lat else float("nan"),
        "ops_per_commit": (items * 4 / commits) if commits else 1.0,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--url", default=os.environ.get("REVEILLE_TEST_PG_URL", ""))
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--threads", default="16,32,64,128", help="comma-separated")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rate", type=float, default=1000.0)
    args = ap.parse_args()
    if not args.url:
        print("bench/ledger_pg.py: give --url or set REVEILLE_TEST_PG_URL", file=sys.stderr)
        return 2
    thread_counts = [int(t) for t in str(args.threads).split(",") if t.strip()]
    with psycopg.connect(args.url, autocommit=True) as conn:
        sc = conn.execute("SHOW synchronous_commit").fetchone()
        limit = conn.execute("SHOW max_connections").fetchone()
        used = conn.execute("SELECT count(*) FROM pg_stat_activity").fetchone()
    # Each ledger process also holds a writer, a listener and a small read pool.
    spare_connections = int(limit[0] if limit else 100) - int(used[0] if used else 0) - 8
    print(
        f"PostgreSQL ledger, {args.procs} processes x T threads, {os.cpu_count()} cores, "
        f"synchronous_commit=on (server default {sc[0] if sc else '?'}), "
        f"{args.seconds:.0f} s per run"
    )
    best: dict[str, float] = {}
    for n, threads in enumerate(thread_counts):
        tp = _run("throughput", args.url, args.procs, threads, args.seconds, args.rate)
        best["pipeline"] = max(best.get("pipeline", 0.0), tp["items_per_s"])
        print(
            f"  {args.procs} x {threads:<3} pipeline {tp['items_per_s']:6.0f} items/s  "
            f"({tp['ops_per_commit']:.1f} ops per commit)  p50 {tp['p50_ms']:.1f} ms  "
            f"p99 {tp['p99_ms']:.1f} ms"
        )
        if n == 0:
            lt = _run("latency", args.url, args.procs, threads, args.seconds, args.rate)
            print(
                f"  {args.procs} x {threads:<3} offered {args.rate:.0f}/s: "
                f"{lt['items_per_s']:.0f} items/s  enqueue-to-ack p50 {lt['p50_ms']:.1f} ms"
                f"  p99 {lt['p99_ms']:.1f} ms"
            )
        if args.procs * threads > spare_connections:
            print(
                f"  {args.procs} x {threads:<3} baseline skipped: it needs "
                f"{args.procs * threads} connections, the server has {spare_connections} "
                "to spare"
            )
            continue
        bl = _run("baseline", args.url, args.procs, threads, args.seconds, args.rate)
        best["baseline"] = max(best.get("baseline", 0.0), bl["items_per_s"])
        print(
            f"  {args.procs} x {threads:<3} baseline {bl['items_per_s']:6.0f} items/s  "
            f"(one commit per write)  p50 {bl['p50_ms']:.1f} ms  p99 {bl['p99_ms']:.1f} ms"
            f"  -> pipeline {tp['items_per_s'] / bl['items_per_s']:.1f}x"
        )
    if "baseline" in best:
        print(
            f"  best pipeline {best['pipeline']:.0f} items/s = "
            f"{best['pipeline'] / best['baseline']:.1f}x the best baseline "
            f"({best['baseline']:.0f} items/s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
