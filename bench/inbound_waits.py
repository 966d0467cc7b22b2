"""Inbound events benchmark: events per second on a hook while many ``wake_when`` waits are
open on other hooks.

An arriving event fires the open waits on its hook (``delivery.inbound.receive``). Before the
ledger had a ``hook`` column, every event read up to 10,000 open waits of every hook and
filtered them in Python; now the store answers by hook through an index. Both are measured in
the same run over the same store: ``--waits`` open waits on another hook, then ``--events``
events posted to a hook none of them listens on, once with the old scan (re-created here)
and once with the store's query. Prints events/s for each.

Usage: python bench/inbound_waits.py [--waits 10000] [--events 50] [--store sqlite|memory]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import storage
from delivery import inbound
from delivery.events import WAIT_KIND
from delivery.inbound import HookRoute, WaitMatch, WaitOrigin, receive, set_wait
from delivery.inbound_backend import HookBackend, HookEvent
from delivery.ledger import Ledger
from delivery.rows import LedgerRow, RowQuery

WRITER_THREADS = 16
ORIGIN = WaitOrigin(session_key="bench", origin_session_id="bench")


def _scan_every_wait(ledger: Ledger, hook: str) -> list[LedgerRow]:
    """The open waits as they were found before the hook column: read them all, filter here."""
    query = RowQuery(kind=WAIT_KIND, delivery_state="pending", limit=inbound.OPEN_WAITS_LIMIT)
    return [
        r
        for r in ledger.query(query)
        if isinstance(r.event, dict)
        and r.event.get("hook") == hook
        and r.event.get("outcome") == "expired"
        and r.claim_token is None
    ]


def _set_waits(hooks: HookBackend, ledger: Ledger, count: int) -> float:
    def one(_: int) -> None:
        set_wait(
            hooks,
            ledger,
            hook="deploys",
            match=WaitMatch(path="env", equals="prod"),
            note="tell me when prod is deployed",
            lifetime_seconds=86_400,
            lookback_seconds=0,
            origin=ORIGIN,
        )

    start = time.perf_counter()
    with ThreadPoolExecutor(WRITER_THREADS) as pool:
        list(pool.map(one, range(count)))
    return time.perf_counter() - start


def _events_per_second(hooks: HookBackend, ledger: Ledger, count: int, tag: str) -> float:
    route = HookRoute("ci")
    start = time.perf_counter()
    for n in range(count):
        event = HookEvent("ci", f"{tag}-{n}", time.time(), json.dumps({"build": n}))
        receipt = receive(hooks, ledger, route, event)
        assert receipt.fired == ()
    return count / (time.perf_counter() - start)


def run(args: argparse.Namespace) -> None:
    if args.store == "sqlite":
        opened = storage.open_storage(f"sqlite:///{tempfile.mkdtemp(prefix='bench-inbound-')}")
    else:
        opened = storage.open_storage("memory://")
    backend, hooks = opened.open_ledger(), opened.open_hooks()
    ledger = Ledger(backend)
    try:
        took = _set_waits(hooks, ledger, args.waits)
        print(f"{args.store}: {args.waits} open waits on another hook set in {took:.1f} s")
        indexed = inbound._open_waits
        inbound._open_waits = _scan_every_wait
        try:
            before = _events_per_second(hooks, ledger, args.events, "before")
        finally:
            inbound._open_waits = indexed
        after = _events_per_second(hooks, ledger, args.events, "after")
        print(f"events/s, scanning every open wait (before): {before:,.1f}")
        print(f"events/s, the store's query by hook (after):  {after:,.1f}")
    finally:
        hooks.close()
        backend.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waits", type=int, default=10_000)
    parser.add_argument("--events", type=int, default=50)
    parser.add_argument("--store", choices=("sqlite", "memory"), default="sqlite")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
