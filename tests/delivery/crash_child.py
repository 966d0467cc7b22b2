"""The process that test_crash.py kills with SIGKILL at a random point.

Usage: crash_child.py LEDGER_PATH M SEED

It dispatches M delegations (each runner sleeps a few ms) and, on a second thread, consumes
the completion queue like a front end: claim, hand off, acknowledge. Every line is written
with one os.write() after the step it reports has returned, so whatever the parent reads
happened, and nothing is lost in a buffer when the process dies:

    DISPATCHED <id> <status>    dispatch returned (the row is durable)
    HANDOFF <id> <token>        claimed; the event is now handed on (the point of no return)
    ACK <id> <True|False>       complete_event_delivery returned
    DONE                        everything dispatched was delivered
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.async_delegation import (
    claim_event_delivery,
    complete_event_delivery,
    configure_runtime,
    dispatch_async_delegation,
)
from tools.process_registry import CompletionQueue


def say(line: str) -> None:
    os.write(1, (line + "\n").encode())


def main() -> None:
    path, m, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    handoff_delays = [rng.uniform(0, 0.002) for _ in range(m)]
    queue = CompletionQueue()
    configure_runtime(path, completion_queue=queue)
    say("READY")

    def consume() -> None:
        for i in range(m):
            evt = queue.get(timeout=30)
            claim = claim_event_delivery(evt, "crash-child")
            if claim is None:
                say(f"SKIP {evt['delegation_id']}")
                continue
            say(f"HANDOFF {evt['delegation_id']} {claim}")
            time.sleep(handoff_delays[i])  # the hand-off itself takes a moment
            ok = complete_event_delivery(evt, claim)
            say(f"ACK {evt['delegation_id']} {ok}")

    consumer = threading.Thread(target=consume)
    consumer.start()
    for i in range(m):
        delay = rng.uniform(0.001, 0.006)

        def run(i: int = i, delay: float = delay) -> dict[str, object]:
            time.sleep(delay)
            return {"status": "completed", "summary": f"result {i}"}

        res = dispatch_async_delegation(goal=f"task {i}", runner=run, session_key="crash")
        say(f"DISPATCHED {res['delegation_id']} {res['status']}")
    consumer.join()
    say("DONE")


if __name__ == "__main__":
    main()
