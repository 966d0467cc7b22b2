"""API server benchmark: non-streaming chat completions with the demo model, 32 clients.

Starts `reveille serve` (the real server: sessions, transcript writes, the agent loop with
the offline demo model) and, as the baseline, a bare aiohttp handler that returns a canned
completion; each runs in its own process on a loopback port. A closed-loop load of
``--clients`` concurrent clients (aiohttp, one new conversation per request) runs against
each for ``--seconds``. Prints requests/s and p50/p99 latency for both and their ratio.

Usage: python bench/api_server.py [--clients 32] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
CANNED = {
    "id": "chatcmpl-canned",
    "object": "chat.completion",
    "created": 0,
    "model": "canned",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello from a canned handler."},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11},
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_canned(port: int) -> None:
    async def complete(request: web.Request) -> web.Response:
        await request.json()
        return web.json_response(CANNED)

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", complete)
    app.router.add_get("/health", health)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


async def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}")
            try:
                async with http.get(f"{url}/health") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise RuntimeError(f"{url} did not become healthy")


async def load(url: str, clients: int, seconds: float) -> dict[str, float]:
    latencies: list[float] = []
    errors = 0
    counter = 0
    stop_at = time.perf_counter() + seconds
    connector = aiohttp.TCPConnector(limit=clients)

    async def client(http: aiohttp.ClientSession, index: int) -> None:
        nonlocal errors, counter
        while time.perf_counter() < stop_at:
            counter += 1
            body = {
                "model": "reveille-demo",
                "messages": [{"role": "user", "content": f"hello, request {index}-{counter}"}],
                "stream": False,
            }
            start = time.perf_counter()
            async with http.post(f"{url}/v1/chat/completions", json=body) as resp:
                payload = await resp.json()
                if resp.status != 200 or not payload["choices"][0]["message"]["content"]:
                    errors += 1
                    continue
            latencies.append((time.perf_counter() - start) * 1000)

    async with aiohttp.ClientSession(connector=connector) as http:
        began = time.perf_counter()
        await asyncio.gather(*(client(http, i) for i in range(clients)))
        elapsed = time.perf_counter() - began
    q = statistics.quantiles(latencies, n=100)
    return {
        "requests": len(latencies),
        "errors": errors,
        "rps": len(latencies) / elapsed,
        "p50": q[49],
        "p99": q[98],
    }


async def measure(cmd: list[str], env: dict[str, str], port: int, args: argparse.Namespace):
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_healthy(url, proc)
        await load(url, args.clients, min(2.0, args.seconds / 4))  # warm-up
        return await load(url, args.clients, args.seconds)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


async def main_async(args: argparse.Namespace) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as home:
        port = free_port()
        reveille_env = {
            **env,
            "REVEILLE_HOME": home,
            "REVEILLE_PORT": str(port),
            "REVEILLE_MAX_CONCURRENT_RUNS": str(args.clients * 2),
        }
        cmd = [sys.executable, "-m", "reveille.cli", "serve"]
        ours = await measure(cmd, reveille_env, port, args)
    port = free_port()
    base = await measure([sys.executable, __file__, "--serve-canned", str(port)], env, port, args)

    def line(name: str, r: dict[str, float]) -> str:
        return (
            f"{name:<22}: {r['rps']:8,.0f} requests/s   p50 {r['p50']:6.2f} ms   "
            f"p99 {r['p99']:6.2f} ms   ({r['requests']} ok, {r['errors']} errors)"
        )

    print(
        f"{args.clients} concurrent clients, {args.seconds:.0f} s each, non-streaming, "
        f"{os.cpu_count()} cores"
    )
    print(line("reveille serve (demo)", ours))
    print(line("bare aiohttp (canned)", base))
    print(f"ratio                 : {ours['rps'] / base['rps']:.2f} of the baseline's requests/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--serve-canned", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_canned:
        serve_canned(args.serve_canned)
        return
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
