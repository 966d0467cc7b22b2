"""Python calls per turn: what a turn of `reveille serve` costs in interpreter work, counted
rather than timed, beside the same count for its floor.

A busy machine makes turns/s figures noisy; the number of Python function calls a turn
makes (every call and every resumption of a coroutine or generator, in every thread of the
server process: the event loop, the store's reader and writer, the log's writer) is
steady, and it is what most of a turn's CPU follows. Each server runs under a counting
hook (``sys.setprofile`` and ``threading.setprofile``); after a warm-up the count is read,
``--requests`` new conversations are sent by ``--clients`` concurrent clients, and the
count is read again: the difference over the requests is the figure.

Demo mode (the default) counts `reveille serve` with the offline demo model and the store
floor of ``bench/api_server.py`` (a bare handler making a new conversation's two store
trips). ``--provider`` counts `reveille serve` using the fake upstream of
``bench/api_server.py`` (not counted) and the stored-turn floor (the model call as
Reveille makes it, plus the two store trips). ``--top N`` lists the N functions called most
per turn by `reveille serve`.

Usage: python bench/turn_calls.py [--provider] [--requests 1000] [--clients 32] [--top 40]
                                  [--loop asyncio]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import pickle
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import aiohttp
import api_server as bench  # bench/ is on the path: this script's directory

HERE = Path(__file__).resolve()
Key = tuple[str, int, str]
Counts = dict[tuple[Key, Key], int]  # (caller, callee): calls


def count_calls_and_run(snapshot: str, argv: list[str]) -> None:
    """Run ``argv`` (``-m module args...`` or ``script args...``) in this process with
    every Python call counted; SIGUSR1 writes the counts so far to ``snapshot``."""
    counts: collections.Counter[tuple[CodeType | None, CodeType]] = collections.Counter()

    def hook(frame: FrameType, event: str, _arg: Any) -> None:
        if event == "call":
            back = frame.f_back
            counts[back.f_code if back is not None else None, frame.f_code] += 1

    def write(*_: Any) -> None:
        sys.setprofile(None)  # the hook must not count the writing
        out: Counts = {}
        for (caller, code), n in list(counts.items()):
            key = (_key(caller), _key(code))
            out[key] = out.get(key, 0) + n
        part = f"{snapshot}.part"
        with open(part, "wb") as f:
            pickle.dump(out, f)
        os.replace(part, snapshot)
        sys.setprofile(hook)

    signal.signal(signal.SIGUSR1, write)
    threading.setprofile(hook)
    sys.setprofile(hook)
    if argv[0] == "-m":
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        runpy.run_path(argv[0], run_name="__main__")


def _key(code: CodeType | None) -> Key:
    if code is None:
        return ("", 0, "(no Python caller)")
    return (code.co_filename, code.co_firstlineno, code.co_name)


def read_counts(pid: int, snapshot: Path) -> Counts:
    snapshot.unlink(missing_ok=True)
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + 30
    while not snapshot.exists():
        if time.monotonic() > deadline:
            raise RuntimeError("the server wrote no counts")
        time.sleep(0.05)
    with snapshot.open("rb") as f:
        counts: Counts = pickle.load(f)
    return counts


async def send(url: str, requests: int, clients: int, model: str, tag: str) -> None:
    """``requests`` new conversations, ``clients`` at a time; each must be answered."""
    slots = asyncio.Semaphore(clients)
    async with aiohttp.ClientSession() as http:

        async def one(index: int) -> None:
            body = {"model": model, "messages": [{"role": "user", "content": f"{tag} {index}"}]}
            async with slots, http.post(f"{url}/v1/chat/completions", json=body) as resp:
                payload = await resp.json()
                if resp.status != 200:
                    raise RuntimeError(f"{resp.status}: {payload}")

        await asyncio.gather(*(one(i) for i in range(requests)))


async def per_turn(
    server: list[str], env: dict[str, str], port: int, args: argparse.Namespace, model: str
) -> tuple[float, Counts]:
    """Calls per turn of the server ``server`` starts (counted), and the counts of each
    function over the measured requests."""
    with tempfile.TemporaryDirectory() as scratch:
        snapshot = Path(scratch) / "counts"
        cmd = [sys.executable, str(HERE), "--count-into", str(snapshot), "--", *server]
        log = Path(scratch) / "log"
        with log.open("wb") as err:
            # The counted server runs in this process (``count_calls_and_run``): its pid.
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        url = f"http://127.0.0.1:{port}"
        try:
            try:
                await bench.wait_healthy(url, proc, timeout=60)
            except RuntimeError:
                sys.stderr.write(log.read_text(errors="replace")[-4000:])
                raise
            await send(url, 300, args.clients, model, "warm-up")
            await asyncio.sleep(0.5)  # what the warm-up queued (log lines, commits) is done
            before = read_counts(proc.pid, snapshot)
            await send(url, args.requests, args.clients, model, "measured")
            await asyncio.sleep(0.5)
            after = read_counts(proc.pid, snapshot)
        finally:
            bench.stop_process(proc)
    spent = {key: n - before.get(key, 0) for key, n in after.items()}
    return sum(spent.values()) / args.requests, spent


def _where(key: Key) -> str:
    path = key[0]
    for prefix in (f"{bench.ROOT}/", "site-packages/", "/lib/python3.11/"):
        path = path.split(prefix)[-1]
    return f"{path}:{key[1]}"


async def main_async(args: argparse.Namespace) -> None:
    os.environ["REVEILLE_EVENT_LOOP"] = args.loop
    env = {**os.environ, "PYTHONPATH": bench.checkout_first()}
    script = str(HERE.parent / "api_server.py")
    with tempfile.TemporaryDirectory() as home, tempfile.TemporaryDirectory() as floor_home:
        port = bench.free_port()
        ours_env = bench.reveille_env(env, home, port, args.clients)
        if not args.provider:
            ours, counts = await per_turn(
                ["-m", "reveille.cli", "serve"], ours_env, port, args, "reveille-demo"
            )
            floor_port = bench.free_port()
            floor_cmd = [script, "--serve-store-floor", str(floor_port), "--home", floor_home]
            floor, floor_counts = await per_turn(floor_cmd, env, floor_port, args, "reveille-demo")
            names = ("reveille serve (demo)", "store floor")
        else:
            upstream_port = bench.free_port()
            upstream_cmd = [sys.executable, script, "--serve-upstream", str(upstream_port)]
            async with bench.running(upstream_cmd, env, upstream_port) as upstream_url:
                ours_env |= {
                    "REVEILLE_PROVIDER": "openai",
                    "REVEILLE_MODEL": bench.UPSTREAM_MODEL,
                    "OPENAI_BASE_URL": f"{upstream_url}/v1",
                    "OPENAI_API_KEY": bench.UPSTREAM_KEY,
                }
                model = bench.UPSTREAM_MODEL
                ours, counts = await per_turn(
                    ["-m", "reveille.cli", "serve"], ours_env, port, args, model
                )
                floor_port = bench.free_port()
                floor_cmd = [
                    script, "--serve-model-call-floor", str(floor_port),
                    "--upstream", upstream_url, "--home", floor_home,
                ]  # fmt: skip
                floor, floor_counts = await per_turn(floor_cmd, env, floor_port, args, model)
            names = ("reveille serve (openai)", "stored-turn floor")
    print(
        f"{args.requests} new conversations, {args.clients} concurrent clients, "
        f"{args.loop} event loop; Python calls (and resumptions) per turn, every thread"
    )
    print(f"{names[0]:<24}: {ours:7.1f}")
    print(f"{names[1]:<24}: {floor:7.1f}")
    print(f"{'above the floor':<24}: {ours - floor:7.1f} ({ours / floor:.2f}x)")
    if args.dump:
        with open(args.dump, "wb") as f:
            pickle.dump({"ours": counts, "floor": floor_counts, "requests": args.requests}, f)
    if args.top:
        print(f"the {args.top} functions called most per turn by reveille serve:")
        callees: collections.Counter[Key] = collections.Counter()
        callers: dict[Key, collections.Counter[Key]] = collections.defaultdict(collections.Counter)
        for (caller, callee), n in counts.items():
            callees[callee] += n
            callers[callee][caller] += n
        for key, n in callees.most_common(args.top):
            print(f"  {n / args.requests:7.2f}  {key[2]:<32} {_where(key)}")
            for caller, m in callers[key].most_common(args.callers):
                print(f"  {'':7}    {m / args.requests:7.2f}  from {caller[2]} {_where(caller)}")


def main() -> None:
    if "--count-into" in sys.argv:
        at = sys.argv.index("--count-into")
        count_calls_and_run(sys.argv[at + 1], sys.argv[at + 3 :])
        return
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--provider", action="store_true", help="count a provider turn")
    ap.add_argument("--requests", type=int, default=1000, help="measured new conversations")
    ap.add_argument("--clients", type=int, default=32, help="concurrent clients")
    ap.add_argument("--top", type=int, default=0, help="list the N functions called most")
    ap.add_argument(
        "--callers", type=int, default=0, help="with --top: each one's N most frequent callers"
    )
    ap.add_argument("--dump", help="write both servers' counts (caller, callee) to this pickle")
    ap.add_argument(
        "--loop", default="asyncio", choices=("asyncio", "uvloop"), help="the servers' loop"
    )
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
