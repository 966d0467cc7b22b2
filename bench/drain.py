"""Drain benchmark: how long `reveille serve` takes from SIGTERM to exit.

Three cases, each on a fresh state directory with the offline demo model (whose sub-agent
works ``REVEILLE_DEMO_DELAY_SECONDS``):

- idle: no work running; what a drain costs when there is nothing to wait for;
- within the grace: ``--units`` background sub-agents running, each ending ``--work`` seconds
  after it started, well inside ``drain_seconds``; the drain waits for them and delivers
  their results before it exits. Prints the time to exit and how much of it was the work's
  own remaining time;
- past the grace: the same sub-agents working far longer than ``--grace``; they end
  ``interrupted`` (with a notice) when the grace runs out. Prints the time to exit and its
  excess over the grace.

Usage: python bench/drain.py [--runs 3] [--units 3] [--work 2.0] [--grace 1.0]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.ports import free_port  # noqa: E402


def start(home: str, port: int, demo_delay: float, grace: float) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "REVEILLE_HOME": home,
        "REVEILLE_PORT": str(port),
        "REVEILLE_WEBUI_PORT": "0",
        "REVEILLE_DEMO_DELAY_SECONDS": str(demo_delay),
        "REVEILLE_DRAIN_SECONDS": str(grace),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "reveille.cli", "serve"],
        env=env,
        cwd=ROOT,  # ``python -m`` looks in the working directory first: this checkout's code
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1):
                return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("reveille serve did not become ready")


def dispatch(port: int, goal: str) -> None:
    body = {"model": "reveille-demo", "messages": [{"role": "user", "content": goal}]}
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        resp.read()


def drain_once(units: int, work: float, grace: float) -> tuple[float, float]:
    """(seconds from SIGTERM to exit, seconds of the work left at SIGTERM)."""
    with tempfile.TemporaryDirectory() as home:
        port = free_port()
        proc = start(home, port, work, grace)
        try:
            began = time.monotonic()
            for i in range(units):
                dispatch(port, f"in the background: unit {i}")
            left = max(0.0, work - (time.monotonic() - began)) if units else 0.0
            sent = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=grace + work + 60)
            return time.monotonic() - sent, left
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def summary(values: list[float]) -> str:
    low, high = min(values), max(values)
    return f"median {statistics.median(values):.2f} s (min {low:.2f}, max {high:.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--units", type=int, default=3, help="background sub-agents running")
    ap.add_argument("--work", type=float, default=2.0, help="seconds each sub-agent works")
    ap.add_argument("--grace", type=float, default=1.0, help="drain_seconds of the last case")
    args = ap.parse_args()

    idle = [drain_once(0, 0.05, 30)[0] for _ in range(args.runs)]
    within = [drain_once(args.units, args.work, 30) for _ in range(args.runs)]
    past = [drain_once(args.units, 60, args.grace)[0] for _ in range(args.runs)]

    print(f"{os.cpu_count()} cores, {args.runs} runs per case")
    width = 34
    print(f"{'idle server':<{width}}: SIGTERM -> exit {summary(idle)}")
    print(
        f"{f'{args.units} sub-agents within the grace':<{width}}: SIGTERM -> exit "
        f"{summary([t for t, _ in within])}; their work had "
        f"{statistics.median([left for _, left in within]):.2f} s left; the drain added "
        f"{summary([t - left for t, left in within])}"
    )
    print(
        f"{f'{args.units} sub-agents past a {args.grace:g} s grace':<{width}}: SIGTERM -> exit "
        f"{summary(past)}; over the grace by {summary([t - args.grace for t in past])}"
    )


if __name__ == "__main__":
    main()
