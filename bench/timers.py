"""Timers benchmark: many pending wake-ups, a burst due in the same second, and idle cost.

A timer is a ledger row due later (``Ledger.schedule``); the re-offer scheduler sleeps until
the earliest due time and offers what is due; a consumer claims and acknowledges each, as the
gateway's watcher does. Prints, for one run on this machine and one store:

  * setting: timers written per second (``--pending`` rows, written from several threads so
    the writer group-commits them as the tool's calls from many turns would be);
  * idle floor: the CPU this process spends per second with the scheduler running over an
    empty ledger, then the same with every timer pending (the burst still ahead and the
    rest days away): what holding them costs beyond the floor, and how many scheduler passes
    ran meanwhile (a pass per timer would be polling);
  * burst: ``--burst`` timers due in the same second; firing lateness (due -> offered and
    due -> acknowledged) p50 and p99, wake-ups per second, and the CPU spent from the due
    time until the last acknowledgement (this process's, PostgreSQL's) against the cores;
  * the same idle figure after the burst, with the rest still pending, in two windows, once
    the scheduler has passed over the changed ledger (that pass reads it again: the
    change's cost, not holding's);
  * the same again after a restart: the pending timers are handed to a process that has
    exited (the server's previous self, in a real restart), the running scheduler takes them
    over (how long that took is printed), then idles (two windows again).

On PostgreSQL each idle figure also gives the CPU of this host's PostgreSQL processes over the
same window: the scheduler's queries run there, not in this process.

The process's garbage collector is set as `reveille serve` sets it once started
(``reveille.collector``); ``--collector default`` leaves CPython's, for comparison.

Usage: python bench/timers.py [--pending 100000] [--burst 10000] [--idle-seconds 5]
                              [--store sqlite|postgresql] [--url postgresql://...]
                              [--collector server|default]
PostgreSQL: the url defaults to REVEILLE_TEST_PG_URL; the run gets a fresh schema, dropped
after it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import server_gc
from proc_cpu import processes

from delivery.events import SCHEDULED_WAKEUP, TIMER_KIND
from delivery.identity import ProcessIdentity, current_identity, process_start_ticks
from tools import async_delegation as ad
from tools.completion_queue import CompletionQueue

LEAD_SECONDS = 3.0  # the burst is due this long after its rows are written
WRITER_THREADS = 16


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Consumer:
    """Claims and acknowledges every offered wake-up; stamps when each was offered and acked."""

    def __init__(self, queue: CompletionQueue, expected: int) -> None:
        self.queue = queue
        self.expected = expected
        self.offered: dict[str, float] = {}
        self.acked: dict[str, float] = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _handle(self, event: dict[str, Any]) -> None:
        claim = await ad.aclaim_event_delivery(event, "bench")
        if not claim:
            return
        await ad.acomplete_event_delivery(event, claim)
        self.acked[event["delivery_id"]] = time.time()
        if len(self.acked) >= self.expected:
            self.done.set()

    async def _main(self) -> None:
        tasks: set[asyncio.Task[None]] = set()
        while True:
            event = await self.queue.get_async()
            if event is None:
                break
            self.offered.setdefault(event["delivery_id"], time.time())
            task = asyncio.create_task(self._handle(event))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)

    def stop(self) -> None:
        self.queue.put(None)  # type: ignore[arg-type]
        self.thread.join(timeout=30)


def _event(row_id: str, due: float) -> dict[str, Any]:
    return {
        "type": SCHEDULED_WAKEUP,
        "delivery_id": row_id,
        "status": "completed",
        "note": "bench",
        "due_at": due,
        "session_key": "bench",
        "completed_at": due,
    }


def _write(ledger: Any, dues: list[tuple[str, float]]) -> float:
    """Write the timers from several threads; return the seconds it took."""
    chunks = [dues[i::WRITER_THREADS] for i in range(WRITER_THREADS)]

    def work(chunk: list[tuple[str, float]]) -> None:
        for row_id, due in chunk:
            ledger.schedule(
                row_id,
                kind=TIMER_KIND,
                event=_event(row_id, due),
                not_before=due,
                session_key="bench",
                goal="bench",
            )

    threads = [threading.Thread(target=work, args=(c,)) for c in chunks]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start


def _postgres_cpu() -> dict[int, float] | None:
    """The CPU seconds each of this host's PostgreSQL processes has used so far, by pid (a
    pass's queries run there, not in this process); None when none runs here."""
    used = {pid: p.seconds for pid, p in processes().items() if p.name == "postgres"}
    return used or None


def _spent(before: dict[int, float], after: dict[int, float]) -> float:
    """The CPU seconds spent between two readings of ``_postgres_cpu``: a process started
    meanwhile counts whole; one that exited meanwhile is left out (its last moments are
    lost, rather than its whole life taken off the sum)."""
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())


@dataclass(frozen=True)
class Idle:
    """One idle window: CPU per second of this process and (None on SQLite) of this host's
    PostgreSQL processes, and the scheduler passes in it."""

    own: float
    db: float | None
    passes: int

    def beyond(self, floor: Idle) -> str:
        """This window's CPU beyond the floor's, as printed."""
        text = f"beyond the floor {(self.own - floor.own) * 100:+.2f} points"
        if self.db is not None and floor.db is not None:
            both = (self.own + self.db) - (floor.own + floor.db)
            text += f" ({both * 100:+.2f} with PostgreSQL's)"
        return text


class _Passes:
    """The scheduler's passes while counted (``_counting``): how many, and an event set by
    each."""

    def __init__(self) -> None:
        self.count = 0
        self.ran = threading.Event()


@contextlib.contextmanager
def _counting(scheduler: Any) -> Iterator[_Passes]:
    """Count the scheduler's passes for as long as the block runs."""
    passes = _Passes()
    original = scheduler._pass

    def counted() -> float:
        result = float(original())
        passes.count += 1
        passes.ran.set()
        return result

    scheduler._pass = counted
    try:
        yield passes
    finally:
        scheduler._pass = original


@dataclass(frozen=True)
class Spent:
    """The CPU seconds this process (and, None on SQLite, this host's PostgreSQL processes)
    spent over ``wall`` seconds."""

    own: float
    db: float | None
    wall: float


def _spending(wait: Callable[[], object], *, db: bool) -> Spent:
    """What ``wait()`` took: its wall-clock time and the CPU spent meanwhile."""
    db0 = _postgres_cpu() if db else None
    cpu0, wall0 = time.process_time(), time.perf_counter()
    wait()
    cpu = time.process_time() - cpu0
    wall = time.perf_counter() - wall0
    db1 = _postgres_cpu() if db0 is not None else None
    return Spent(cpu, _spent(db0, db1) if db0 is not None and db1 is not None else None, wall)


def _idle(rt: Any, seconds: float, *, db: bool) -> Idle:
    """The CPU this process (and, when ``db``, this host's PostgreSQL processes) spent per
    second over ``seconds``, and the scheduler passes meanwhile."""
    with _counting(rt.scheduler) as passes:
        spent = _spending(lambda: time.sleep(seconds), db=db)
    per_second = None if spent.db is None else spent.db / spent.wall
    return Idle(spent.own / spent.wall, per_second, passes.count)


def _settle(rt: Any) -> None:
    """Have the scheduler pass once now, and wait for it: the first pass after the ledger
    changed reads it again (the holders of its rows), which is the change's cost, not
    holding's."""
    with _counting(rt.scheduler) as passes:
        rt.scheduler._poke()
        passes.ran.wait(timeout=30)


def _with_db(window: Idle) -> str:
    """A window's CPU as printed: this process's, and PostgreSQL's beside it."""
    text = f"{window.own * 100:6.2f}% of a core"
    if window.db is not None:
        text += f" (+ PostgreSQL's processes {window.db * 100:.2f}%)"
    return f"{text}, {window.passes} scheduler passes"


def _exited_identity() -> str:
    """The identity of a process of this host that has exited."""
    child = subprocess.Popen([sys.executable, "-c", "input()"], stdin=subprocess.PIPE)
    me, ticks = current_identity(), process_start_ticks(child.pid)
    child.communicate(b"\n")
    assert ticks is not None
    return str(ProcessIdentity(me.host, me.boot_id, child.pid, ticks))


def _hand_pending_to(holder: str, args: argparse.Namespace, backend: Any, url: str) -> None:
    """Make ``holder`` the holder of every pending row, on a connection of its own: what a
    server leaves behind when it is killed holding them."""
    if args.store == "sqlite":
        conn = sqlite3.connect(backend.path)
        with conn:
            conn.execute(_HAND_OVER.format("?"), (holder,))
        conn.close()
        return
    import psycopg

    with psycopg.connect(url, autocommit=True) as pg:
        pg.execute(_HAND_OVER.format("%s"), (holder,))


_HAND_OVER = "UPDATE deliveries SET holder = {} WHERE delivery_state = 'pending'"


def _open_backend(args: argparse.Namespace, workdir: str) -> tuple[Any, Any, str]:
    """The ledger store to measure, a function that cleans up after it, and its url."""
    import storage

    if args.store == "sqlite":
        store = storage.open_storage(f"sqlite:///{workdir}")
        return store.open_ledger(), lambda: None, ""
    import psycopg

    base = args.url or os.environ.get("REVEILLE_TEST_PG_URL", "")
    if not base:
        sys.exit("--store postgresql needs --url or REVEILLE_TEST_PG_URL")
    schema = f"bench_timers_{secrets.token_hex(4)}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in base else "?"
    url = f"{base}{sep}options={quote(f'-csearch_path={schema}')}"

    def drop() -> None:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")

    return storage.open_storage(url).open_ledger(), drop, url


def run(args: argparse.Namespace) -> None:
    workdir = tempfile.mkdtemp(prefix="bench-timers-")
    backend, cleanup, url = _open_backend(args, workdir)
    queue = CompletionQueue()
    rt = ad.configure_runtime(backend=backend, completion_queue=queue, max_queued=args.burst * 2)
    try:
        rt.start_scheduler("bench")
        server_gc.apply(args)
        time.sleep(0.5)
        on_postgres = args.store == "postgresql"
        floor = _idle(rt, args.idle_seconds, db=on_postgres)

        now = time.time()
        later = args.pending - args.burst
        # The rest: spread over the next 30 days, an hour away at the nearest.
        far = [
            (f"tmr_far{i:07d}", now + 3600 + (30 * 86400 - 3600) * i / max(later, 1))
            for i in range(later)
        ]
        far_seconds = _write(rt.ledger, far)
        # Due once all of the burst is surely written, at the rate the rest was written.
        due = time.time() + LEAD_SECONDS + 1.5 * args.burst * far_seconds / max(later, 1)
        burst = [(f"tmr_burst{i:06d}", due) for i in range(args.burst)]
        consumer = Consumer(queue, args.burst)
        consumer.thread.start()
        burst_seconds = _write(rt.ledger, burst)
        written = len(far) + len(burst)
        set_rate = written / (far_seconds + burst_seconds)
        print(
            f"store: {args.store}; {written:,} timers written at {set_rate:,.0f}/s "
            f"({WRITER_THREADS} threads); garbage collector: {args.collector}"
        )
        if time.time() >= due:
            print(f"  (the burst was written late: {time.time() - due:.2f} s after its due time)")

        held = _idle(rt, min(args.idle_seconds, max(due - time.time() - 0.2, 0)), db=on_postgres)
        time.sleep(max(due - time.time(), 0.0))
        burst_cpu = _spending(lambda: consumer.done.wait(timeout=120), db=on_postgres)
        offered = [consumer.offered[r] - due for r, _ in burst if r in consumer.offered]
        acked = [consumer.acked[r] - due for r, _ in burst if r in consumer.acked]
        print(f"burst: {len(acked):,}/{args.burst:,} due at once acknowledged")
        if acked:
            span = max(acked) - min(0.0, min(acked))
            print(
                f"  lateness due->offered  p50 {_percentile(offered, 0.5) * 1000:8.1f} ms   "
                f"p99 {_percentile(offered, 0.99) * 1000:8.1f} ms"
            )
            print(
                f"  lateness due->acked    p50 {_percentile(acked, 0.5) * 1000:8.1f} ms   "
                f"p99 {_percentile(acked, 0.99) * 1000:8.1f} ms   "
                f"max {max(acked) * 1000:.1f} ms"
            )
            print(
                f"  wake-ups/s             {len(acked) / span:,.0f} "
                f"(all {len(acked):,} acknowledged {span:.2f} s after their due time)"
            )
            # On a machine of few cores the burst's threads and PostgreSQL's share them:
            # how busy they were says how much of the lateness is waiting for a core.
            cores = os.cpu_count() or 1
            db_cpu = burst_cpu.db or 0.0
            print(
                f"  CPU, due -> all acked  this process {burst_cpu.own:.2f} s"
                + ("" if burst_cpu.db is None else f" + PostgreSQL's {db_cpu:.2f} s")
                + f" in {burst_cpu.wall:.2f} s: "
                f"{(burst_cpu.own + db_cpu) / burst_cpu.wall / cores:.0%} of {cores} cores"
            )
        consumer.stop()
        time.sleep(2.0)  # the burst's last commits and checkpoint are not idle cost
        _settle(rt)
        after = [_idle(rt, args.idle_seconds, db=on_postgres) for _ in range(2)]
        print(f"idle CPU (scheduler running, {args.idle_seconds:.0f} s windows):")
        print(f"  floor, empty ledger           {_with_db(floor)}")
        print(f"  {written:,} pending (burst ahead) {_with_db(held)} (window cut to the burst)")
        for label, window in zip(("after burst", "next window"), after, strict=True):
            print(f"  {later:,} pending, {label:<11} {_with_db(window)}; {window.beyond(floor)}")

        dead = _exited_identity()
        _hand_pending_to(dead, args, backend, url)
        rt.ledger.notify_others()  # as the dead server's record, pruned, would have
        start = time.perf_counter()
        while dead in backend.pending_holders() and time.perf_counter() - start < 300:
            time.sleep(0.1)
        taken = time.perf_counter() - start
        time.sleep(2.0)  # the take-over's last commits and checkpoint are not idle cost
        _settle(rt)
        print(
            f"  after a restart: {later:,} pending, held by the exited server, taken over in "
            f"{taken:.1f} s; then:"
        )
        for label in ("first window", "next window"):
            window = _idle(rt, args.idle_seconds, db=on_postgres)
            print(f"  {later:,} pending, {label:<12} {_with_db(window)}; {window.beyond(floor)}")
    finally:
        ad.reset_runtime()
        cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pending", type=int, default=100_000)
    parser.add_argument("--burst", type=int, default=10_000)
    parser.add_argument("--idle-seconds", type=float, default=5.0)
    parser.add_argument("--store", choices=("sqlite", "postgresql"), default="sqlite")
    server_gc.add_option(parser)
    parser.add_argument("--url", default="")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
