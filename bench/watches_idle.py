"""Output watches benchmark: the CPU that idle output watches cost this process.

An output watch reads what its process appended since its last pass, every
``OUTPUT_POLL_SECONDS`` (``tools.watches``). ``--watches`` watches follow processes that
write nothing (``sleep``; ``--per-process`` watches each) over a memory ledger; the process's
CPU time (every thread) is measured over ``--seconds``, first with no watch (the floor),
then with every watch running. Prints the floor and the watches' cost above it, in percent
of one core and per pass of one watch.

Usage: python bench/watches_idle.py [--watches 100] [--per-process 10] [--seconds 10]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import storage
from delivery.ledger import Ledger
from tools import watches as watches_module
from tools.background_processes import ProcessRegistry
from tools.completion_queue import CompletionQueue
from tools.delegation_runtime import DelegationRuntime
from tools.watch_rules import WatchOrigin, parse_watch
from tools.watches import WatchManager

ORIGIN = WatchOrigin(session_key="bench", origin_session_id="bench")


def _cpu_share(seconds: float) -> float:
    """This process's CPU time over ``seconds`` of wall time, as a share of one core."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    time.sleep(seconds)
    return (time.process_time() - cpu0) / (time.perf_counter() - wall0)


def run(args: argparse.Namespace) -> None:
    home = Path(tempfile.mkdtemp(prefix="bench-watches-"))
    runtime = DelegationRuntime(
        Ledger(storage.open_storage("memory://").open_ledger()), CompletionQueue()
    )
    registry = ProcessRegistry(CompletionQueue(), runtime=lambda: runtime)
    registry.attach(runtime.ledger, directory=home / "processes")
    manager = WatchManager(runtime=lambda: runtime, processes=lambda: registry)
    manager.attach(runtime.ledger, shell_enabled=True, workdir=str(home))
    spawned: list[int] = []
    try:
        floor = _cpu_share(args.seconds)
        processes = -(-args.watches // args.per_process)
        for p in range(processes):
            proc = registry.spawn("sleep 600", session_key="bench", notify_on_complete=False)
            spawned.append(int(proc["pid"]))
            for w in range(min(args.per_process, args.watches - p * args.per_process)):
                spec = parse_watch(
                    {"note": "idle", "process_id": proc["process_id"], "pattern": "NEVER"},
                    time.time(),
                    min_interval_seconds=1,
                )
                manager.create(f"watch_{p}_{w}", spec, ORIGIN)
        time.sleep(1.0)  # every watch has made its first pass
        busy = _cpu_share(args.seconds)
        passes = args.watches * args.seconds / watches_module.OUTPUT_POLL_SECONDS
        cost = (busy - floor) * args.seconds / passes
        print(
            f"{args.watches} idle output watches, a pass every "
            f"{watches_module.OUTPUT_POLL_SECONDS:g} s each, over {args.seconds:g} s:"
        )
        print(f"  CPU floor (no watch): {floor * 100:.2f}% of a core")
        print(
            f"  with the watches:     {busy * 100:.2f}% of a core "
            f"(+{(busy - floor) * 100:.2f}%, {cost * 1e6:.0f} us per pass)"
        )
    finally:
        manager.detach()
        for pid in spawned:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        runtime.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--watches", type=int, default=100)
    parser.add_argument("--per-process", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=10.0)
    run(parser.parse_args())


if __name__ == "__main__":
    main()
