"""Webhook benchmark: what a hostile receiver costs the server (issue 29, item 2).

Receivers run in a child process (so the figures are the sender's alone), on loopback:
``/huge`` answers 200 with a body of ``--huge-mib`` MiB streamed from a generator, ``/hang``
accepts and never answers, ``/ok`` answers 204 at once and notes when each event arrived.
The sender is the real ``WebhookSender`` with its default policy on a SQLite store.

- swell: ``--huge`` events owed to ``/huge``; prints this process's RSS before, its peak
  while the answers stream, and after.
- swell (reveille serve): the same against a real ``reveille serve`` (demo model) whose
  webhooks go to ``/huge``: ``--huge`` background responses (``POST /v1/responses``) end,
  each owes a ``response.completed`` webhook; prints the server's RSS before, its peak and
  after.
- stall: ``--events`` events owed to ``/hang`` and ``/ok`` before the sender starts (the
  backlog a restart finds); prints the healthy receiver's lateness (arrival minus the
  event's creation: median and max) while the hanging one still holds its first sends, then
  the lateness of one more event made after that.

Usage: python bench/webhooks.py [--huge 4] [--huge-mib 400] [--events 100]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.ports import free_port  # noqa: E402

MIB = 1024 * 1024


def rss_mib(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# -- the receivers' process --------------------------------------------------------------


async def serve_receivers(huge_bytes: int) -> None:
    from aiohttp import web

    arrivals: dict[str, float] = {}
    chunk = b"x" * MIB

    async def huge(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(status=200)
        resp.content_length = huge_bytes
        await resp.prepare(request)
        sent = 0
        try:
            while sent < huge_bytes:
                await resp.write(chunk)
                sent += len(chunk)
        except (ConnectionError, RuntimeError):
            pass
        return resp

    async def hang(request: web.Request) -> web.Response:
        await request.read()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def ok(request: web.Request) -> web.Response:
        await request.read()
        arrivals.setdefault(request.headers.get("webhook-id", ""), time.time())
        return web.Response(status=204)

    async def seen(request: web.Request) -> web.Response:
        return web.json_response(arrivals)

    app = web.Application()
    app.router.add_post("/huge", huge)
    app.router.add_post("/hang", hang)
    app.router.add_post("/ok", ok)
    app.router.add_get("/arrivals", seen)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(runner.addresses[0][1], flush=True)
    await asyncio.Event().wait()


# -- the sender's side -------------------------------------------------------------------


async def arrivals(base: str) -> dict[str, float]:
    import aiohttp

    async with aiohttp.ClientSession() as http, http.get(f"{base}/arrivals") as resp:
        return dict(await resp.json())


async def swell(base: str, home: Path, count: int, mib: int) -> None:
    import storage
    from gateway.webhooks import WebhookSender, new_secret

    store = storage.sqlite_files(ledger=home / "swell.db").open_webhooks()
    sender = WebhookSender(store, [f"{base}/huge"], secret=new_secret())
    before = peak = rss_mib()
    started = time.perf_counter()
    await sender.start()
    ids = [await sender.aenqueue("response.completed", f"resp_{i}") for i in range(count)]
    while any(r.state == "pending" for i in ids for r in store.deliveries(i)):
        peak = max(peak, rss_mib())
        await asyncio.sleep(0.05)
    took = time.perf_counter() - started
    await sender.stop()
    store.close()
    print(
        f"swell: {count} answers of {mib} MiB: RSS {before:.0f} MiB before, peak "
        f"{peak:.0f} MiB, {rss_mib():.0f} MiB after ({took:.2f} s to settle all)"
    )


async def stall(base: str, home: Path, events: int) -> None:
    import storage
    from gateway.webhooks import WebhookSender, new_secret

    store = storage.sqlite_files(ledger=home / "stall.db").open_webhooks()
    sender = WebhookSender(store, [f"{base}/hang", f"{base}/ok"], secret=new_secret())
    ids = [sender.enqueue("response.completed", f"resp_{i}") for i in range(events)]
    created = {i: store.deliveries(i)[0].created_at for i in ids}
    await sender.start()
    while len(got := await arrivals(base)) < events:
        await asyncio.sleep(0.05)
    late = [got[i] - created[i] for i in ids]
    hanging = [r for i in ids for r in store.deliveries(i) if r.endpoint.endswith("/hang")]
    unsettled = sum(1 for r in hanging if r.state == "pending")
    print(
        f"stall: {events} events owed to a hanging and a healthy receiver: healthy lateness "
        f"median {statistics.median(late):.2f} s, max {max(late):.2f} s; the hanging one "
        f"still owed {unsettled} of {events}"
    )
    extra = await sender.aenqueue("response.completed", "resp_extra")
    made = store.deliveries(extra)[0].created_at
    while extra not in (got := await arrivals(base)):
        await asyncio.sleep(0.02)
    took = got[extra] - made
    print(f"stall: one more event made after that reached the healthy one in {took:.2f} s")
    await sender.stop()
    store.close()


async def swell_server(base: str, home: Path, count: int, mib: int) -> None:
    import aiohttp

    import storage
    from gateway.webhooks import new_secret

    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "REVEILLE_HOME": str(home / "serve"),
        "REVEILLE_PORT": str(port),
        "REVEILLE_WEBUI_PORT": "0",
        "REVEILLE_DEMO_DELAY_SECONDS": "0",
        "API_SERVER_KEY": "bench-key",
        "REVEILLE_WEBHOOK_URLS": f"{base}/huge",
        "REVEILLE_WEBHOOK_SECRET": new_secret(),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "reveille.cli", "serve"],
        env=env,
        cwd=ROOT,  # ``python -m`` looks in the working directory first: this checkout's code
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        headers = {"Authorization": "Bearer bench-key"}
        async with aiohttp.ClientSession() as http:
            for _ in range(600):
                try:
                    async with http.get(f"{url}/readyz") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)  # let it settle before the baseline
            before = peak = rss_mib(proc.pid)
            for i in range(count):
                body = {"model": "reveille-demo", "input": f"hello {i}", "background": True}
                async with http.post(f"{url}/v1/responses", json=body, headers=headers) as resp:
                    assert resp.status < 300, await resp.text()
            store = storage.sqlite_files(ledger=home / "serve" / "ledger.db").open_webhooks()
            try:
                while sum(1 for r in store.recent(100) if r.state == "delivered") < count:
                    peak = max(peak, rss_mib(proc.pid))
                    await asyncio.sleep(0.05)
            finally:
                store.close()
            await asyncio.sleep(1.0)
            after = rss_mib(proc.pid)
        print(
            f"swell (reveille serve): {count} answers of {mib} MiB: server RSS {before:.0f} MiB "
            f"before, peak {peak:.0f} MiB, {after:.0f} MiB after"
        )
    finally:
        proc.terminate()
        proc.wait(30)


async def main(args: argparse.Namespace) -> None:
    child = subprocess.Popen(
        [sys.executable, __file__, "--receivers", str(args.huge_mib)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        base = f"http://127.0.0.1:{child.stdout.readline().strip()}"
        with tempfile.TemporaryDirectory() as tmp:
            await swell(base, Path(tmp), args.huge, args.huge_mib)
            await swell_server(base, Path(tmp), args.huge, args.huge_mib)
            await stall(base, Path(tmp), args.events)
    finally:
        child.kill()
        child.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--huge", type=int, default=4)
    parser.add_argument("--huge-mib", type=int, default=400)
    parser.add_argument("--events", type=int, default=100)
    parser.add_argument("--receivers", type=int, default=0, help=argparse.SUPPRESS)
    parsed = parser.parse_args()
    if parsed.receivers:
        asyncio.run(serve_receivers(parsed.receivers * MIB))
    else:
        asyncio.run(main(parsed))
