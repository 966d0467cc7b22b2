"""API server benchmark: chat completions through `reveille serve`, 32 clients.

Demo mode (the default): starts `reveille serve` (the real server: sessions, transcript
writes, the agent loop with the offline demo model) and, as the baseline, a bare aiohttp
handler that returns a canned completion; each runs in its own process on a loopback port.
A third server, the store floor, is the bare handler plus the two trips to the real session
store that a new conversation's turn cannot do without (the read that resolves it, in the
reader thread; the durable commit of its first turn, by the writer thread, storing the
user's message and the demo model's reply as the turn stores them): how close to the
baseline any turn that stores itself can come in one process.

Provider mode (``--provider``): starts a fake OpenAI-compatible upstream in its own process
(canned ``chat.completion`` JSON, or SSE chunks then ``data: [DONE]`` when asked to stream),
measures it alone, then measures `reveille serve` configured to use it as its model
provider (``REVEILLE_PROVIDER=openai``, ``OPENAI_BASE_URL``, ``OPENAI_API_KEY``,
``REVEILLE_MODEL``) while it keeps running: every Reveille turn is one upstream call. Then
the model-call floor: a bare handler that makes only that upstream call, as Reveille makes
it, and nothing else; then the stored-turn floor: the same handler plus the store floor's two
trips (what any provider turn that stores itself pays at least); then the offered-tools
floor: the stored-turn floor whose call also carries the tool schemas Reveille offers its
model (the fake upstream records them from Reveille's own requests; about 6 KB that the client
writes and the upstream reads on every call): what a provider turn that offers the server's
tools pays at least.

A closed-loop load of ``--clients`` concurrent clients (aiohttp, one new conversation per
request) runs against each for ``--seconds``. Prints requests/s and p50/p99 latency for both
and their ratio. ``--stream`` makes the clients ask for (and read) SSE answers.

Workers (``--workers 1,2``): demo mode measures `reveille serve --workers N` for each N
listed (a supervisor and N worker processes on one port, SO_REUSEPORT, one state
directory), each on a fresh state directory under the same load, and prints the demo turns/s
of each beside the baseline lines; the load generator is one more process on the same cores.

Stores (``--store postgresql``): the demo servers and the store floor run on SQLite and then
on PostgreSQL (``--pg-url``, default ``REVEILLE_TEST_PG_URL``; each server gets a fresh
schema, dropped after), with ``--workers`` for each store, all in one run; it prints
PostgreSQL against SQLite and against its own floor, and the round trips to PostgreSQL per
turn (each server counts them: ``storage.postgres.trips``).

``--load-procs N`` splits the clients over N load processes, for machines with many cores
where one load process would saturate first.

Time to first token (``--ttft``): a fake upstream that streams slowly (first piece after
``--first-delay``, then one every ``--interval``); streamed requests one at a time, directly
and through `reveille serve` (which has tools registered, the case that used to hold text
back until a step ended). Prints p50/p99 of both and of what Reveille adds.

Responses (``--responses``): the Responses API, foreground and background, measured against
the chat path of the same server in the same run: requests/s and time to first token
(``bench/responses_mode.py``).

Event loops (``--loop asyncio,uvloop``, the default where uvloop is installed): demo and
provider modes run once per loop, every server of the run (`reveille serve` and the floors)
on that loop (``REVEILLE_EVENT_LOOP``), and print one block per loop.

Pairs (``--pairs N``): demo and provider modes then measure `reveille serve` (one worker, the
first store) N more times, each run followed at once by its floor (the store floor; the
stored-turn floor), and print each pair's ratio and their median: a floor measured once,
minutes from Reveille, drifts with the machine.

Server CPU: every server the bench starts is measured for the CPU its process and workers
spend per answered request (``/proc``; where there is none, no figure). It is printed on each
line, and ``--pairs`` prints the floor's CPU as a share of Reveille's: on a machine whose few
cores the load generator shares, steadier than the ratio of requests/s.

Usage: python bench/api_server.py [--provider] [--stream] [--clients 32] [--seconds 10]
                                  [--loop asyncio,uvloop] [--pairs 3]
       python bench/api_server.py --responses [--clients 16] [--seconds 5] [--requests 20]
       python bench/api_server.py --workers 1,2 [--seconds 6]
       python bench/api_server.py --store postgresql [--workers 1,2,4] [--seconds 5]
       python bench/api_server.py --ttft [--requests 30] [--first-delay 0.3] [--interval 0.2]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from proc_cpu import processes  # noqa: E402

import storage  # noqa: E402
from tests.ports import free_port  # noqa: E402


def _choices(content: str) -> list[dict[str, Any]]:
    """A chat completion's one choice: ``content`` from the assistant, finished."""
    return [
        {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
    ]


CANNED = {
    "id": "chatcmpl-canned",
    "object": "chat.completion",
    "created": 0,
    "model": "canned",
    "choices": _choices("Hello from a canned handler."),
    "usage": {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11},
}


UPSTREAM_MODEL = "canned-upstream"
UPSTREAM_KEY = "sk-bench-upstream"
UPSTREAM_PIECES = ["Hello ", "from ", "a canned ", "upstream."]
UPSTREAM_REPLY = "".join(UPSTREAM_PIECES)


def _chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-canned",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": UPSTREAM_MODEL,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


def _upstream_stream_body(include_usage: bool) -> bytes:
    chunks = [_chunk({"role": "assistant", "content": ""})]
    chunks += [_chunk({"content": piece}) for piece in UPSTREAM_PIECES]
    chunks.append(_chunk({}, "stop"))
    if include_usage:
        usage = {**_chunk({}), "choices": [], "usage": CANNED["usage"]}
        chunks.append(usage)
    lines = [f"data: {json.dumps(chunk)}\n\n" for chunk in chunks]
    lines.append("data: [DONE]\n\n")
    return "".join(lines).encode()


def checkout_first() -> str:
    """PYTHONPATH for the servers: this checkout first, then whatever the caller had."""
    return os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


async def _health(_: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def serve_completions(port: int, complete: Any, extra: Sequence[tuple[str, str, Any]] = ()) -> None:
    """Serve ``complete`` as ``POST /v1/chat/completions`` (and ``GET /health``, and the
    ``extra`` routes) on loopback, on the event loop ``REVEILLE_EVENT_LOOP`` names, as
    `reveille serve` would (``--loop``)."""
    from reveille.event_loop import choose_event_loop

    app = web.Application()
    app.router.add_post("/v1/chat/completions", complete)
    app.router.add_get("/health", _health)
    for method, path, handler in extra:
        app.router.add_route(method, path, handler)
    loop = choose_event_loop().factory()
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, loop=loop)


def serve_canned(port: int) -> None:
    async def complete(request: web.Request) -> web.Response:
        await request.json()
        return web.json_response(CANNED)

    serve_completions(port, complete)


def store_trips(home: str, pg_url: str | None = None) -> Any:
    """A coroutine function making a new conversation's two trips to the real session store
    and nothing else: the read that resolves the conversation (in the reader thread) and the
    durable commit of its first turn (group-committed by the writer thread), which stores
    ``said`` (the user's message) and ``reply`` as a turn stores them: the text search
    indexes what was said, so a floor storing less would spare its writer work that no turn
    is spared.
    ``pg_url``: the same two on the PostgreSQL session store at that url instead of
    SQLite's."""
    from gateway.config import Platform
    from gateway.session import SessionSource, SessionStore
    from gateway.turns.conversation import derive_session_id

    where = (
        storage.open_storage(pg_url)
        if pg_url
        else storage.sqlite_files(sessions=Path(home) / "sessions.db")
    )
    store = SessionStore(where.open_sessions())

    async def trips(messages: list[dict[str, Any]], said: str, reply: str) -> None:
        session_id = derive_session_id(messages)
        await store.asessions_by_prefix(session_id)
        await store.aappend_turn(
            session_id,
            [
                {"role": "user", "content": said},
                {"role": "assistant", "content": reply},
            ],
            create=SessionSource(platform=Platform.API_SERVER, chat_id=session_id),
        )

    return trips


def serve_store_floor(port: int, home: str, pg_url: str | None = None) -> None:
    """A bare aiohttp handler that makes a new conversation's two store trips and nothing
    else, storing and answering the demo model's reply: what every demo turn pays at least,
    whatever the turn service, agent and middleware cost."""
    from agent.providers.demo import plain_reply
    from gateway.turns.conversation import message_text

    trips = store_trips(home, pg_url)

    async def complete(request: web.Request) -> web.Response:
        body = await request.json()
        messages = body["messages"]
        said = message_text(messages[-1])
        reply = plain_reply(said)
        await trips(messages, said, reply)
        return web.json_response({**CANNED, "choices": _choices(reply)})

    serve_completions(port, complete)


def _offered_tools(upstream_url: str) -> list[Any]:
    """The tool schemas the fake upstream recorded from Reveille's requests."""
    with urllib.request.urlopen(f"{upstream_url}/bench/offered-tools", timeout=10) as resp:
        offered = json.load(resp)
    if not offered:
        raise RuntimeError("the upstream saw no tools offered: no floor to measure")
    return list(offered)


def serve_model_call_floor(
    port: int, upstream_url: str, *, raw: bool, home: str | None = None, tools: bool = False
) -> None:
    """A bare aiohttp handler that makes one call to the upstream the way Reveille makes it
    (``OpenAICompatProvider``: the official client on its aiohttp transport, the raw JSON
    path) and nothing else: what every provider turn pays at least. ``raw`` makes the same
    call with a plain aiohttp client instead, to show what the official client costs.
    ``home`` adds a new conversation's two store trips (``store_trips``): what a provider
    turn that stores itself pays at least. ``tools`` sends the tool schemas Reveille offered
    the model with each call (the fake upstream recorded them from Reveille's own requests):
    what a provider turn that offers the server's tools pays at least."""
    trips = store_trips(home) if home is not None else None
    # Asked once, before serving: Reveille was measured first, so the upstream has seen them.
    offered = _offered_tools(upstream_url) if tools else None
    from agent.messages import ChatMessage
    from agent.providers.openai_compat import OpenAICompatProvider
    from gateway.turns.conversation import message_text

    provider = OpenAICompatProvider(f"{upstream_url}/v1", UPSTREAM_KEY, UPSTREAM_MODEL)
    http: list[aiohttp.ClientSession] = []

    async def call(messages: list[dict[str, Any]]) -> Any:
        if not raw:
            asked = cast(list[ChatMessage], messages)  # the client's JSON, as the API hands it
            return (await provider.complete(asked, tools=offered)).content
        if not http:
            http.append(aiohttp.ClientSession())
        async with http[0].post(
            f"{upstream_url}/v1/chat/completions",
            json={"model": UPSTREAM_MODEL, "messages": messages},
            headers={"Authorization": f"Bearer {UPSTREAM_KEY}"},
        ) as resp:
            return (await resp.json())["choices"][0]["message"]["content"]

    async def complete(request: web.Request) -> web.Response:
        body = await request.json()
        if trips is not None:
            # Stored as Reveille stores the turn: the reply is the upstream's, which is canned.
            messages = body["messages"]
            await trips(messages, message_text(messages[-1]), UPSTREAM_REPLY)
        content = await call(body["messages"])
        return web.json_response({**CANNED, "model": UPSTREAM_MODEL, "x": content})

    serve_completions(port, complete)


def serve_upstream(port: int) -> None:
    """A fake OpenAI-compatible model endpoint: canned JSON, or canned SSE when streaming."""
    answer = {
        **CANNED,
        "model": UPSTREAM_MODEL,
        "choices": _choices(UPSTREAM_REPLY),
    }
    with_usage = _upstream_stream_body(include_usage=True)
    without_usage = _upstream_stream_body(include_usage=False)

    offered: list[Any] = []

    async def complete(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("tools") and not offered:
            offered.extend(body["tools"])  # what Reveille offers its model, for the floors
        if not body.get("stream"):
            return web.json_response(answer)
        options = body.get("stream_options") or {}
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        await response.write(with_usage if options.get("include_usage") else without_usage)
        await response.write_eof()
        return response

    async def offered_tools(_: web.Request) -> web.Response:
        return web.json_response(offered)

    serve_completions(port, complete, extra=[("GET", "/bench/offered-tools", offered_tools)])


def serve_slow_upstream(port: int, first_delay: float, interval: float) -> None:
    """A fake model that streams like a slow real one: its first piece after
    ``first_delay`` seconds, then one piece every ``interval``."""

    async def complete(request: web.Request) -> web.StreamResponse:
        await request.json()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await asyncio.sleep(first_delay)
        for index, piece in enumerate(UPSTREAM_PIECES):
            if index:
                await asyncio.sleep(interval)
            data = json.dumps(_chunk({"content": piece}))
            await response.write(f"data: {data}\n\n".encode())
        await response.write(f"data: {json.dumps(_chunk({}, 'stop'))}\n\ndata: [DONE]\n\n".encode())
        await response.write_eof()
        return response

    serve_completions(port, complete)


async def first_token_ms(url: str, model: str, requests: int) -> list[float]:
    """Time from sending a streamed request to its first content piece, one at a time."""
    out: list[float] = []
    async with aiohttp.ClientSession() as http:
        for index in range(requests):
            body = {
                "model": model,
                "stream": True,
                "messages": [{"role": "user", "content": f"tell me something {index}"}],
            }
            start = time.perf_counter()
            async with http.post(f"{url}/v1/chat/completions", json=body) as resp:
                async for raw in resp.content:
                    line = raw.decode().strip()
                    if not line.startswith("data: {"):
                        continue
                    choices = json.loads(line[6:]).get("choices") or [{}]
                    if choices[0].get("delta", {}).get("content"):
                        out.append((time.perf_counter() - start) * 1000)
                        break
                await resp.read()
    return out


async def ttft_main_async(args: argparse.Namespace) -> None:
    env = {**os.environ, "PYTHONPATH": checkout_first()}
    upstream_port = free_port()
    upstream_cmd = [
        sys.executable, __file__, "--serve-slow-upstream", str(upstream_port),
        "--first-delay", str(args.first_delay), "--interval", str(args.interval),
    ]  # fmt: skip
    async with running(upstream_cmd, env, upstream_port) as upstream_url:
        direct = await first_token_ms(upstream_url, UPSTREAM_MODEL, args.requests)
        async with reveille_on(upstream_url, env, clients=4) as url:
            await first_token_ms(url, UPSTREAM_MODEL, 2)  # warm-up: the client, imports
            ours = await first_token_ms(url, UPSTREAM_MODEL, args.requests)
    pieces = len(UPSTREAM_PIECES)
    total = args.first_delay + (pieces - 1) * args.interval
    print(
        f"time to first token, {args.requests} streamed requests one at a time; the upstream "
        f"sends its first piece after {args.first_delay * 1000:.0f} ms, then one every "
        f"{args.interval * 1000:.0f} ms ({pieces} pieces, {total * 1000:.0f} ms in all)"
    )
    for name, figures in (("fake upstream directly", direct), ("through reveille serve", ours)):
        q = statistics.quantiles(figures, n=100)
        print(f"{name:<23}: p50 {q[49]:7.1f} ms   p99 {q[98]:7.1f} ms")
    added = [b - a for a, b in zip(sorted(direct), sorted(ours), strict=True)]
    q = statistics.quantiles(added, n=100)
    print(f"{'added by reveille':<23}: p50 {q[49]:7.1f} ms   p99 {q[98]:7.1f} ms")


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


async def _read_stream(resp: aiohttp.ClientResponse) -> bool:
    """Reads an SSE answer to its end; true when it carried content and ended with [DONE]."""
    content = False
    done = False
    async for raw in resp.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            done = True
            continue
        choices = json.loads(data).get("choices") or []
        if choices and (choices[0].get("delta") or {}).get("content"):
            content = True
    return content and done


# One request of a closed-loop client: (session, client index, request number) -> ok.
OneRequest = Callable[[aiohttp.ClientSession, int, int], Awaitable[bool]]


async def closed_loop(clients: int, seconds: float, one: OneRequest) -> dict[str, float]:
    """``clients`` concurrent clients, each sending its next request as soon as the last
    answered, for ``seconds``: requests/s and p50/p99 latency of the answers that were ok."""
    latencies: list[float] = []
    errors = 0
    counter = 0
    stop_at = time.perf_counter() + seconds

    async def client(http: aiohttp.ClientSession, index: int) -> None:
        nonlocal errors, counter
        while time.perf_counter() < stop_at:
            counter += 1
            start = time.perf_counter()
            if not await one(http, index, counter):
                errors += 1
                continue
            latencies.append((time.perf_counter() - start) * 1000)

    connector = aiohttp.TCPConnector(limit=clients)
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


async def load(
    url: str, clients: int, seconds: float, stream: bool = False, model: str = "reveille-demo"
) -> dict[str, float]:
    """Chat completions, one new conversation per request."""
    # Neither another load process nor this process's earlier load (the warm-up before a
    # measured run) may have opened the same conversation: its request would continue that
    # session or open a second one beside it, not a new conversation.
    tag = f"request {os.getpid()}-{secrets.token_hex(4)}"

    async def chat(http: aiohttp.ClientSession, index: int, counter: int) -> bool:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": f"hello, {tag}-{index}-{counter}"}],
            "stream": stream,
        }
        async with http.post(f"{url}/v1/chat/completions", json=body) as resp:
            if stream:
                return resp.status == 200 and await _read_stream(resp)
            payload = await resp.json()
            return resp.status == 200 and bool(payload["choices"][0]["message"]["content"])

    return await closed_loop(clients, seconds, chat)


@contextlib.asynccontextmanager
async def running(cmd: list[str], env: dict[str, str], port: int) -> AsyncIterator[str]:
    """Runs ``cmd`` (a server on ``port``) until the block ends; yields its url once healthy."""
    # The server's log goes to a file, not a pipe nobody reads (a full pipe would stall it).
    with tempfile.TemporaryFile() as log:
        # From the checkout itself: ``python -m`` looks in the working directory first, so
        # a bench of another checkout run from here would measure this one's code.
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)
        url = f"http://127.0.0.1:{port}"
        _server_pids[url] = proc.pid
        try:
            try:
                await wait_healthy(url, proc)
            except RuntimeError:
                log.seek(0)
                sys.stderr.write(log.read()[-4000:].decode(errors="replace"))
                raise
            yield url
        finally:
            _server_pids.pop(url, None)
            stop_process(proc)


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """Terminate a server the bench started; kill it if it has not exited in 10 s."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# The process each running server's url belongs to (``running``): its CPU is read around
# a measurement (``measure_url``).
_server_pids: dict[str, int] = {}


def process_tree_cpu(pid: int) -> float | None:
    """CPU seconds (user and system) used so far by process ``pid`` and its descendants
    (a supervisor's workers), from ``/proc``; None where there is no ``/proc``."""
    if not Path(f"/proc/{pid}/stat").exists():
        return None
    running = processes()
    tree = {pid}
    grew = True
    while grew:
        found = {child for child, proc in running.items() if proc.parent in tree} - tree
        grew = bool(found)
        tree |= found
    return sum(running[each].seconds for each in tree if each in running)


async def with_server_cpu(url: str, measured: Awaitable[dict[str, float]]) -> dict[str, float]:
    """``measured`` (a load against ``url``), with the server's CPU milliseconds per answered
    request (``cpu_ms``, its process and workers: steadier than requests/s on a machine
    whose cores the load shares) when the bench started that server. A PostgreSQL server's
    own CPU is not in it."""
    pid = _server_pids.get(url)
    before = process_tree_cpu(pid) if pid is not None else None
    figures = await measured
    after = process_tree_cpu(pid) if pid is not None else None
    if before is not None and after is not None and figures["requests"]:
        figures["cpu_ms"] = (after - before) * 1000 / figures["requests"]
    return figures


async def measure_url(
    url: str, args: argparse.Namespace, model: str = "reveille-demo"
) -> dict[str, float]:
    stream = args.stream
    await load(url, args.clients, min(2.0, args.seconds / 4), stream, model)  # warm-up
    if args.load_procs > 1:
        return await with_server_cpu(url, spread_load(url, args, model))
    return await with_server_cpu(url, load(url, args.clients, args.seconds, stream, model))


def _load_in_process(
    url: str, clients: int, seconds: float, stream: bool, model: str
) -> dict[str, float]:
    return asyncio.run(load(url, clients, seconds, stream, model))


async def spread_load(url: str, args: argparse.Namespace, model: str) -> dict[str, float]:
    """The clients split over ``--load-procs`` processes: on many cores one load process
    saturates before the servers do. Requests/s add up; p50/p99 are the mean of each
    process's (each sees the same server under the same load)."""
    procs = args.load_procs
    share = [args.clients // procs + (i < args.clients % procs) for i in range(procs)]
    loop = asyncio.get_running_loop()
    with concurrent.futures.ProcessPoolExecutor(procs) as pool:
        parts = await asyncio.gather(
            *(
                loop.run_in_executor(
                    pool, _load_in_process, url, n, args.seconds, args.stream, model
                )
                for n in share
                if n
            )
        )
    return {
        "requests": sum(p["requests"] for p in parts),
        "errors": sum(p["errors"] for p in parts),
        "rps": sum(p["rps"] for p in parts),
        "p50": statistics.fmean(p["p50"] for p in parts),
        "p99": statistics.fmean(p["p99"] for p in parts),
    }


async def wait_workers(url: str, workers: int, timeout: float = 60) -> None:
    """Until ``workers`` different pids answered `/health` (each over a new connection, which
    the kernel may give any worker): every worker listens before the load starts."""
    seen: set[int] = set()
    deadline = time.monotonic() + timeout
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as http:
        while len(seen) < workers:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(seen)} of {workers} workers answered")
            async with http.get(f"{url}/health") as resp:
                seen.add((await resp.json())["pid"])


async def measure(
    cmd: list[str], env: dict[str, str], port: int, args: argparse.Namespace, workers: int = 1
) -> dict[str, float]:
    """The load against the server ``cmd`` starts; with its round trips to PostgreSQL per
    request (``trips``) when ``env`` has them counted."""
    async with running(cmd, env, port) as url:
        if workers > 1:
            await wait_workers(url, workers)
        if trips_so_far(env) is None:
            return await measure_url(url, args)
        await load(url, args.clients, min(2.0, args.seconds / 4), args.stream)  # warm-up
        await asyncio.sleep(0.3)  # each process writes its count ten times a second
        before = trips_so_far(env) or 0
        figures = await with_server_cpu(url, load(url, args.clients, args.seconds, args.stream))
        await asyncio.sleep(0.3)
        trips = (trips_so_far(env) or 0) - before
        return {**figures, "trips": trips / max(figures["requests"] + figures["errors"], 1)}


def line(name: str, r: dict[str, float], width: int = 22) -> str:
    cpu = f", server CPU {r['cpu_ms']:.3f} ms/request" if "cpu_ms" in r else ""
    return (
        f"{name:<{width}}: {r['rps']:8,.0f} requests/s   p50 {r['p50']:6.2f} ms   "
        f"p99 {r['p99']:6.2f} ms   ({r['requests']} ok, {r['errors']} errors{cpu})"
    )


def header(args: argparse.Namespace) -> str:
    kind = "streaming" if args.stream else "non-streaming"
    return (
        f"{args.clients} concurrent clients, {args.seconds:.0f} s each, {kind}, "
        f"{os.cpu_count()} cores, {args.load_procs} load process"
        + ("es" if args.load_procs > 1 else "")
    )


def reveille_env(env: dict[str, str], home: str, port: int, clients: int) -> dict[str, str]:
    return {
        **env,
        "REVEILLE_HOME": home,
        "REVEILLE_PORT": str(port),
        "REVEILLE_WEBUI_PORT": "0",  # the API server alone: no second listener to collide
        "REVEILLE_MAX_CONCURRENT_RUNS": str(clients * 2),
    }


@contextlib.asynccontextmanager
async def reveille_on(
    upstream_url: str, env: dict[str, str], *, clients: int
) -> AsyncIterator[str]:
    """`reveille serve` on a fresh state directory, using the fake upstream as its model."""
    with tempfile.TemporaryDirectory() as home:
        port = free_port()
        ours_env = {
            **reveille_env(env, home, port, clients),
            "REVEILLE_PROVIDER": "openai",
            "REVEILLE_MODEL": UPSTREAM_MODEL,
            "OPENAI_BASE_URL": f"{upstream_url}/v1",
            "OPENAI_API_KEY": UPSTREAM_KEY,
        }
        async with running([sys.executable, "-m", "reveille.cli", "serve"], ours_env, port) as url:
            yield url


async def provider_main_async(args: argparse.Namespace) -> None:
    env = {**os.environ, "PYTHONPATH": checkout_first()}
    upstream_port = free_port()
    upstream_cmd = [sys.executable, __file__, "--serve-upstream", str(upstream_port)]
    async with running(upstream_cmd, env, upstream_port) as upstream_url:
        upstream = await measure_url(upstream_url, args, UPSTREAM_MODEL)
        async with reveille_on(upstream_url, env, clients=args.clients) as url:
            ours = await measure_url(url, args, UPSTREAM_MODEL)
        floors = []
        for flag, stores, tools in (
            ("--serve-model-call-floor", False, False),
            ("--serve-model-call-floor", True, False),
            ("--serve-raw-call-floor", False, False),
            ("--serve-model-call-floor", True, True),
        ):
            with tempfile.TemporaryDirectory() as home:
                floor_port = free_port()
                cmd = [sys.executable, __file__, flag, str(floor_port), "--upstream", upstream_url]
                if stores:
                    cmd += ["--home", home]
                if tools:
                    cmd += ["--with-tools"]
                async with running(cmd, env, floor_port) as floor_url:
                    floors.append(await measure_url(floor_url, args, UPSTREAM_MODEL))
        floor, stored_floor, raw_floor, tools_floor = floors
        pairs = []
        for _ in range(args.pairs):
            async with reveille_on(upstream_url, env, clients=args.clients) as url:
                again = await measure_url(url, args, UPSTREAM_MODEL)
            with tempfile.TemporaryDirectory() as home:
                floor_port = free_port()
                cmd = [sys.executable, __file__, "--serve-model-call-floor", str(floor_port)]
                cmd += ["--upstream", upstream_url, "--home", home]
                async with running(cmd, env, floor_port) as floor_url:
                    pairs.append((again, await measure_url(floor_url, args, UPSTREAM_MODEL)))

    print(header(args))
    print(line("fake upstream (canned)", upstream, 23))
    print(line("reveille serve (openai)", ours, 23))
    print(line("aiohttp + 1 model call", floor, 23))
    print(line("... + 2 store trips", stored_floor, 23))
    print(line("aiohttp + 1 raw call", raw_floor, 23))
    print(line("... + tools, 2 trips", tools_floor, 23))
    print(f"{'ratio':<23}: {ours['rps'] / upstream['rps']:.2f} of the upstream's requests/s")
    print(
        f"{'model-call floor':<23}: {floor['rps'] / upstream['rps']:.2f} of the upstream (a "
        "handler making only the upstream call, as Reveille makes it); reveille reaches "
        f"{ours['rps'] / floor['rps']:.2f} of it"
    )
    print(
        f"{'stored-turn floor':<23}: {stored_floor['rps'] / floor['rps']:.2f} of the model-call "
        "floor (the same call plus a new conversation's read and durable write); reveille "
        f"reaches {ours['rps'] / stored_floor['rps']:.2f} of it"
    )
    print(
        f"{'raw-call floor':<23}: {raw_floor['rps'] / upstream['rps']:.2f} of the upstream (the "
        "same call with a plain aiohttp client: the official client costs the difference)"
    )
    print(
        f"{'offered-tools floor':<23}: {tools_floor['rps'] / stored_floor['rps']:.2f} of the "
        "stored-turn floor (the same stored turn, its call carrying the tool schemas Reveille "
        "offers its model, which the upstream must read too); reveille reaches "
        f"{ours['rps'] / tools_floor['rps']:.2f} of it"
    )
    print_pairs("stored-turn floor", pairs, 23)


STORES = ("sqlite", "postgresql")
TRIPS_ENV = "REVEILLE_PG_TRIPS_DIR"  # storage.postgres.trips: each process counts its trips


@contextlib.contextmanager
def store_for(store: str, args: argparse.Namespace) -> Iterator[tuple[str, dict[str, str]]]:
    """A fresh state directory, and for PostgreSQL a fresh schema (no server inherits another's
    rows; dropped after) with the server's round trips counted: the directory and the
    environment that points a server there."""
    with tempfile.TemporaryDirectory() as home:
        if store == "sqlite":
            yield home, {}
            return
        import psycopg

        schema = f"bench_{secrets.token_hex(6)}"
        with psycopg.connect(args.pg_url, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        sep = "&" if "?" in args.pg_url else "?"
        url = f"{args.pg_url}{sep}options={quote('-csearch_path=' + schema)}"
        trips = Path(home) / "trips"
        trips.mkdir()
        try:
            yield home, {"REVEILLE_DATABASE_URL": url, TRIPS_ENV: str(trips)}
        finally:
            with psycopg.connect(args.pg_url, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def trips_so_far(env: dict[str, str]) -> int | None:
    """The round trips the servers under ``env`` made so far (None: not counted)."""
    where = env.get(TRIPS_ENV)
    if where is None:
        return None
    return sum(int(p.read_text() or 0) for p in Path(where).glob("*.trips"))


async def measure_store_floor(
    store: str, env: dict[str, str], args: argparse.Namespace
) -> dict[str, float]:
    """The load against the store floor on ``store``, on a fresh state directory or schema."""
    with store_for(store, args) as (home, extra):
        port = free_port()
        cmd = [sys.executable, __file__, "--serve-store-floor", str(port), "--home", home]
        cmd += ["--pg-url", extra.get("REVEILLE_DATABASE_URL", "")]  # "": SQLite
        return await measure(cmd, {**env, **extra}, port, args)


def print_pairs(
    floor_name: str, pairs: list[tuple[dict[str, float], dict[str, float]]], width: int
) -> None:
    """``--pairs``: each interleaved pair's ratio of Reveille to its floor, and their median.
    A floor measured once, minutes from Reveille, drifts with the machine (it moved by
    40% between two runs of this bench); measured right after it, pair by pair, it drifts
    less, and the median drops the odd pair a burst of other work spoiled."""
    if not pairs:
        return
    ratios = [ours["rps"] / floor["rps"] for ours, floor in pairs]
    each = ", ".join(
        f"{ours['rps']:,.0f}/{floor['rps']:,.0f} = {r:.2f}"
        for (ours, floor), r in zip(pairs, ratios, strict=True)
    )
    print(
        f"{'pairs':<{width}}: reveille against the {floor_name}, {len(pairs)} interleaved "
        f"pair{'s' if len(pairs) > 1 else ''}: "
        f"{each}; median {statistics.median(ratios):.2f}"
    )
    if all("cpu_ms" in ours and "cpu_ms" in floor for ours, floor in pairs):
        # The server's own CPU per request: what the ratio above would be if the load
        # generator did not share the cores (a floor's CPU over Reveille's).
        shares = [floor["cpu_ms"] / ours["cpu_ms"] for ours, floor in pairs]
        each = ", ".join(f"{ours['cpu_ms']:.3f}/{floor['cpu_ms']:.3f} ms" for ours, floor in pairs)
        print(
            f"{'pairs, server CPU':<{width}}: reveille/floor per request: {each}; the floor "
            f"needs {statistics.median(shares):.2f} of reveille's CPU (median)"
        )


async def main_async(args: argparse.Namespace) -> None:
    env = {**os.environ, "PYTHONPATH": checkout_first()}
    served: dict[str, dict[int, dict[str, float]]] = {}
    floors: dict[str, dict[str, float]] = {}
    for store in args.store:
        served[store] = {}
        for workers in args.workers or [1]:
            with store_for(store, args) as (home, extra):
                port = free_port()
                cmd = [sys.executable, "-m", "reveille.cli", "serve", "--workers", str(workers)]
                ours_env = {**reveille_env(env, home, port, args.clients), **extra}
                served[store][workers] = await measure(cmd, ours_env, port, args, workers)
    port = free_port()
    base = await measure([sys.executable, __file__, "--serve-canned", str(port)], env, port, args)
    for store in args.store:
        floors[store] = await measure_store_floor(store, env, args)
    pairs = []
    for _ in range(args.pairs):  # on the first store, with one worker
        store = args.store[0]
        with store_for(store, args) as (home, extra):
            port = free_port()
            cmd = [sys.executable, "-m", "reveille.cli", "serve"]
            again = await measure(
                cmd, {**reveille_env(env, home, port, args.clients), **extra}, port, args
            )
        pairs.append((again, await measure_store_floor(store, env, args)))

    print(header(args))
    both = len(args.store) > 1
    width = 32 if args.workers or both else 22
    for store, by_workers in served.items():
        for workers, figures in by_workers.items():
            name = "reveille serve (demo)" + (f", {store}" if both else "")
            name += f", {_workers(workers)}" if args.workers else ""
            print(line(name, figures, width))
    print(line("bare aiohttp (canned)", base, width))
    for store, floor in floors.items():
        print(line("aiohttp + 2 store trips" + (f", {store}" if both else ""), floor, width))
    for store, by_workers in served.items():
        ours = next(iter(by_workers.values()))
        first = next(iter(by_workers))
        for workers, figures in by_workers.items():
            name = "ratio" + (f", {store}" if both else "")
            name += f", {_workers(workers)}" if args.workers else ""
            scaling = (
                f"; {figures['rps'] / ours['rps']:.2f}x {_workers(first)}, p99 "
                f"{figures['p99'] / ours['p99']:.2f}x"
                if workers != first
                else ""
            )
            print(
                f"{name:<{width}}: {figures['rps'] / base['rps']:.2f} of the baseline's "
                f"requests/s{scaling}"
            )
        floor = floors[store]
        print(
            f"{'store floor' + (f', {store}' if both else ''):<{width}}: "
            f"{floor['rps'] / base['rps']:.2f} of the baseline (a handler making only a new "
            "turn's read and durable write); reveille"
            + (f" with {_workers(first)}" if args.workers else "")
            + f" reaches {ours['rps'] / floor['rps']:.2f} of it"
        )
    print_pairs(f"store floor ({args.store[0]}, 1 worker)", pairs, width)
    if "postgresql" in served:
        pg = next(iter(served["postgresql"].values()))
        print(
            f"{'round trips per turn':<{width}}: {pg['trips']:.1f} to PostgreSQL per demo turn "
            f"(the store floor's handler: {floors['postgresql']['trips']:.1f})"
        )
    if both:
        sq, pg = (next(iter(served[s].values())) for s in STORES)
        print(
            f"{'postgresql / sqlite':<{width}}: {pg['rps'] / sq['rps']:.2f} of SQLite's turns/s "
            f"(goal 0.8); the PostgreSQL store floor is "
            f"{floors['postgresql']['rps'] / sq['rps']:.2f} of SQLite's turns/s "
            f"({floors['postgresql']['rps'] / floors['sqlite']['rps']:.2f} of SQLite's floor)"
        )


def _workers(count: int) -> str:
    return f"{count} worker{'s' if count > 1 else ''}"


def worker_counts(text: str) -> list[int]:
    """``1,2,4`` -> [1, 2, 4]: the worker counts to measure, each at least 1."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected counts like 1,2") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected counts of at least 1, like 1,2")
    return list(dict.fromkeys(counts))


def _has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def event_loops(text: str) -> list[str]:
    """``asyncio,uvloop`` -> ["asyncio", "uvloop"]: the event loops to measure."""
    names = list(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if not names or set(names) - {"asyncio", "uvloop"}:
        raise argparse.ArgumentTypeError(f"{text!r}: expected loops like asyncio,uvloop")
    if "uvloop" in names and not _has_uvloop():
        raise argparse.ArgumentTypeError("uvloop is not installed (pip install 'reveille[fast]')")
    return names


def store_names(text: str) -> list[str]:
    """``postgresql`` -> [sqlite, postgresql]: SQLite is always measured first, in the same
    run, as the figure PostgreSQL's are held against."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = set(names) - set(STORES)
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"{text!r}: expected sqlite, postgresql or both")
    return ["sqlite", *(["postgresql"] if "postgresql" in names else [])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument(
        "--provider",
        action="store_true",
        help="measure a fake OpenAI-compatible upstream, then reveille serve using it",
    )
    ap.add_argument("--stream", action="store_true", help="clients ask for SSE answers")
    ap.add_argument(
        "--load-procs",
        type=int,
        default=1,
        help="split the clients over this many load processes (for machines with many cores)",
    )
    ap.add_argument(
        "--workers",
        type=worker_counts,
        help="demo mode: measure `reveille serve --workers N` for each N of a list, e.g. 1,2",
    )
    ap.add_argument(
        "--store",
        type=store_names,
        default=["sqlite"],
        help="demo mode: postgresql measures reveille serve and the store floor on "
        "PostgreSQL (--pg-url) beside SQLite's, with the round trips per turn",
    )
    ap.add_argument(
        "--pg-url",
        default=os.environ.get("REVEILLE_TEST_PG_URL", ""),
        help="--store postgresql: the server (each run gets a fresh schema, dropped after); "
        "default REVEILLE_TEST_PG_URL",
    )
    ap.add_argument(
        "--ttft",
        action="store_true",
        help="time to first token through reveille serve against a slowly streaming upstream",
    )
    ap.add_argument(
        "--responses",
        action="store_true",
        help="the Responses API (foreground and background) against the chat path, "
        "requests/s and time to first token (bench/responses_mode.py)",
    )
    ap.add_argument(
        "--loop",
        type=event_loops,
        default=event_loops("asyncio,uvloop" if _has_uvloop() else "asyncio"),
        help="demo and provider modes: the servers' event loops, measured one after the other "
        "in the same run (default: asyncio,uvloop where uvloop is installed)",
    )
    ap.add_argument(
        "--pairs",
        type=int,
        default=0,
        help="demo and provider modes: then N more runs of reveille serve (1 worker, the first "
        "store), each followed at once by its floor (store floor; stored-turn floor): each "
        "pair's ratio and their median",
    )
    ap.add_argument("--requests", type=int, default=30, help="--ttft: streamed requests")
    ap.add_argument("--first-delay", type=float, default=0.3, help="--ttft: upstream's wait")
    ap.add_argument("--interval", type=float, default=0.2, help="--ttft: between pieces")
    ap.add_argument("--serve-slow-upstream", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--serve-canned", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--serve-store-floor", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--home", help=argparse.SUPPRESS)
    ap.add_argument("--serve-model-call-floor", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--serve-raw-call-floor", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--with-tools", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--upstream", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if "postgresql" in args.store and not args.pg_url and not args.serve_store_floor:
        ap.error("--store postgresql needs --pg-url (or REVEILLE_TEST_PG_URL)")
    if args.serve_model_call_floor or args.serve_raw_call_floor:
        raw = bool(args.serve_raw_call_floor)
        serve_model_call_floor(
            args.serve_raw_call_floor or args.serve_model_call_floor,
            args.upstream,
            raw=raw,
            home=args.home,
            tools=args.with_tools,
        )
        return
    if args.serve_store_floor:
        serve_store_floor(args.serve_store_floor, args.home, args.pg_url or None)
        return
    if args.serve_canned:
        serve_canned(args.serve_canned)
        return
    if args.serve_upstream:
        serve_upstream(args.serve_upstream)
        return
    if args.serve_slow_upstream:
        serve_slow_upstream(args.serve_slow_upstream, args.first_delay, args.interval)
        return
    if args.ttft:
        asyncio.run(ttft_main_async(args))
        return
    if args.responses:
        import responses_mode  # bench/ is on the path: this script's directory

        asyncio.run(responses_mode.main_async(args, sys.modules[__name__]))
        return
    for name in args.loop:
        # Every server of the run (reveille serve and the floors) on this loop; the load
        # generator stays on asyncio's, the same for all.
        os.environ["REVEILLE_EVENT_LOOP"] = name
        if len(args.loop) > 1:
            print(f"--- event loop: {name}")
        asyncio.run(provider_main_async(args) if args.provider else main_async(args))


if __name__ == "__main__":
    main()
