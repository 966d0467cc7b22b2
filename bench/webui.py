"""Web UI wake-up latency: from a completion's commit to its ``wakeup`` event in an open tab.

Starts the real stack in this process (gateway runner, API server, the web UI on a loopback
port, SQLite state in a temporary directory, the offline demo model), opens ONE event stream
the way a tab does, and then, ``--completions`` times: dispatches a delegation from a web UI
session whose runner returns at once; the clock starts when the runner returns (the ledger
commit of its completion follows at once, then the queue, the runner's offer, the busy check,
the claim, the wake-up turn's start and the event log write) and stops when the stream
delivers the ``wakeup`` card. One completion at a time, each in its own session. Prints
p50 / p99 / max in milliseconds.

``--other-server`` opens the tab on a second `reveille serve` (a subprocess on the same state
directory) instead: the event crosses processes through the shared log and its pokes.

Usage: python bench/webui.py [--completions 200] [--other-server]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import tools.async_delegation as ad  # noqa: E402
from agent.providers.demo import DemoModel  # noqa: E402
from reveille.app import serve  # noqa: E402
from reveille.settings import Settings  # noqa: E402
from tests.ports import free_port  # noqa: E402


async def _pump(response: aiohttp.ClientResponse, arrived: dict[str, float]) -> None:
    kind, data = "", ""
    async for raw in response.content:
        line = raw.decode().rstrip("\n")
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            data = line[6:]
        elif not line and data:
            if kind == "wakeup":
                card = json.loads(data)["card"]
                arrived[card["goal"]] = time.perf_counter()
            kind, data = "", ""


@contextlib.asynccontextmanager
async def _other_server(home: str) -> Any:
    """A second `reveille serve` on ``home``; yields its web UI's url once it answers."""
    port = free_port()
    env = {
        **os.environ,
        "REVEILLE_HOME": home,
        "REVEILLE_WEBUI_PORT": str(port),
        "API_SERVER_KEY": "bench",
        "PYTHONPATH": str(ROOT),
    }
    cmd = [sys.executable, "-m", "reveille.cli", "serve", "--port", "0"]
    # From the checkout: ``python -m`` looks in the working directory first.
    proc = subprocess.Popen(
        cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(300):
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(base + "/api/bootstrap") as r:
                        if r.status == 200:
                            break
                await asyncio.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def run(completions: int, other_server: bool) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(home=Path(tmp), port=0, webui_port=free_port(), api_key="bench")
        async with contextlib.AsyncExitStack() as stack:
            app = await stack.enter_async_context(
                serve(settings, provider=DemoModel(delay_seconds=0.0))
            )
            server = app.webui
            assert server is not None
            base = f"http://127.0.0.1:{server.port}"
            if other_server:
                base = await stack.enter_async_context(_other_server(tmp))
            async with aiohttp.ClientSession() as http:
                csrf = (await (await http.get(base + "/api/bootstrap")).json())["csrf_token"]
                stream = await http.get(base + "/api/events")
                arrived: dict[str, float] = {}
                pump = asyncio.create_task(_pump(stream, arrived))
                committed: dict[str, float] = {}
                latencies = []
                for i in range(completions):
                    r = await http.post(
                        base + "/api/sessions", json={}, headers={"X-CSRF-Token": csrf}
                    )
                    sid = (await r.json())["session"]["id"]
                    goal = f"bench {i}"

                    def work(goal: str = goal) -> dict[str, Any]:
                        committed[goal] = time.perf_counter()
                        return {"status": "completed", "summary": "ok"}

                    await asyncio.to_thread(
                        ad.dispatch_async_delegation,
                        goal=goal,
                        runner=work,
                        origin_session_id=sid,
                        origin_ui_session_id=sid,
                    )
                    deadline = time.perf_counter() + 10
                    while goal not in arrived and time.perf_counter() < deadline:
                        await asyncio.sleep(0.0005)
                    if goal not in arrived:
                        raise RuntimeError(f"no wakeup event for {goal}")
                    latencies.append((arrived[goal] - committed[goal]) * 1000)
                pump.cancel()
                stream.close()
                return latencies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--completions", type=int, default=200)
    parser.add_argument("--other-server", action="store_true", help="the tab on another server")
    args = parser.parse_args()
    ad.reset_runtime()
    started = time.perf_counter()
    latencies = asyncio.run(run(args.completions, args.other_server))
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    print(f"completions: {len(latencies)} in {time.perf_counter() - started:.1f} s")
    where = "another server's tab" if args.other_server else "same server's tab"
    print(
        f"commit -> wakeup event ({where}): p50 {statistics.median(latencies):.1f} ms, "
        f"p99 {p99:.1f} ms, max {ordered[-1]:.1f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
