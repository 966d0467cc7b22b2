"""The responses mode of ``bench/api_server.py`` (``--responses``): the Responses API measured
against the chat path of the same `reveille serve`, in the same run.

Throughput: a fake OpenAI-compatible upstream (canned answers, its own process) and one
`reveille serve` using it as its model; a closed loop of ``--clients`` clients, each request a
new conversation, against ``POST /v1/chat/completions``, then ``POST /v1/responses``, then
background responses (``background: true``, then ``GET /v1/responses/{id}`` every 20 ms until
it is completed: the whole trip of a client that walks away and polls). Prints requests/s and
p50/p99 latency of each, and each one's ratio to chat. ``--stream`` streams both foreground
paths.

Time to first token: a slowly streaming upstream (``--first-delay``, ``--interval``);
streamed requests one at a time through chat, through ``/v1/responses`` and through a
streamed background response (every event stored before it is sent). Prints p50/p99 of each.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Any

import aiohttp


async def _one_response(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], stream: bool
) -> bool:
    async with http.post(f"{url}/v1/responses", json=body) as resp:
        if resp.status != 200:
            return False
        if stream:
            done = False
            async for raw in resp.content:
                if raw.startswith(b"data:") and b'"response.completed"' in raw:
                    done = True
            return done
        answer = await resp.json()
    if not body.get("background"):
        return answer.get("status") == "completed"
    while True:
        await asyncio.sleep(0.02)
        async with http.get(f"{url}/v1/responses/{answer['id']}") as resp:
            status = (await resp.json()).get("status")
        if status not in ("queued", "in_progress"):
            return status == "completed"


def responses_request(
    url: str, *, stream: bool, background: bool, model: str
) -> Callable[[aiohttp.ClientSession, int, int], Awaitable[bool]]:
    """One request of the closed loop (``base.closed_loop``): a new response, followed to its
    end (read to ``response.completed``, or polled until it left queued/in_progress)."""

    async def one(http: aiohttp.ClientSession, index: int, counter: int) -> bool:
        body = {
            "model": model,
            "input": f"hello, request {index}-{counter}",
            "stream": stream and not background,
            "background": background,
        }
        return await _one_response(http, url, body, stream and not background)

    return one


async def responses_first_token_ms(
    url: str, model: str, requests: int, *, background: bool
) -> list[float]:
    """From sending a streamed request to its first ``response.output_text.delta``."""
    out: list[float] = []
    async with aiohttp.ClientSession() as http:
        for index in range(requests):
            body = {
                "model": model,
                "stream": True,
                "background": background,
                "input": f"tell me something {index}",
            }
            start = time.perf_counter()
            async with http.post(f"{url}/v1/responses", json=body) as resp:
                async for raw in resp.content:
                    if raw.startswith(b"event: response.output_text.delta"):
                        out.append((time.perf_counter() - start) * 1000)
                        break
                await resp.read()
    return out


def _quantiles(name: str, figures: list[float]) -> str:
    q = statistics.quantiles(figures, n=100)
    return f"{name:<28}: p50 {q[49]:7.1f} ms   p99 {q[98]:7.1f} ms"


async def main_async(args: argparse.Namespace, base: ModuleType) -> None:
    """``base``: bench/api_server.py, whose servers, load and printing this mode reuses
    (handed in, not imported: that script is the one that imports this module)."""
    env = {**os.environ, "PYTHONPATH": base.checkout_first()}
    model = base.UPSTREAM_MODEL
    port = base.free_port()
    upstream_cmd = [sys.executable, base.__file__, "--serve-upstream", str(port)]
    async with (
        base.running(upstream_cmd, env, port) as upstream_url,
        base.reveille_on(upstream_url, env, clients=args.clients) as url,
    ):
        warm = min(2.0, args.seconds / 4)
        await base.load(url, args.clients, warm, args.stream, model)
        chat = await base.load(url, args.clients, args.seconds, args.stream, model)
        figures = {"chat completions": chat}
        for name, background in (("responses", False), ("responses, background", True)):
            one = responses_request(url, stream=args.stream, background=background, model=model)
            await base.closed_loop(args.clients, warm, one)
            figures[name] = await base.closed_loop(args.clients, args.seconds, one)
    print(base.header(args) + ", one reveille serve with a canned upstream")
    for name, result in figures.items():
        print(base.line(name, result, 28))
    for name, result in list(figures.items())[1:]:
        print(f"{'ratio, ' + name:<28}: {result['rps'] / chat['rps']:.2f} of chat's requests/s")

    port = base.free_port()
    slow_cmd = [
        sys.executable, base.__file__, "--serve-slow-upstream", str(port),
        "--first-delay", str(args.first_delay), "--interval", str(args.interval),
    ]  # fmt: skip
    async with (
        base.running(slow_cmd, env, port) as upstream_url,
        base.reveille_on(upstream_url, env, clients=4) as url,
    ):
        await base.first_token_ms(url, model, 2)  # warm-up
        chat_ttft = await base.first_token_ms(url, model, args.requests)
        fore = await responses_first_token_ms(url, model, args.requests, background=False)
        back = await responses_first_token_ms(url, model, args.requests, background=True)
    print(
        f"time to first token, {args.requests} streamed requests one at a time; the upstream "
        f"sends its first piece after {args.first_delay * 1000:.0f} ms"
    )
    print(_quantiles("chat completions", chat_ttft))
    print(_quantiles("responses", fore))
    print(_quantiles("responses, background", back))
    print(json.dumps({"ttft_p50_ms": {
        "chat": statistics.median(chat_ttft),
        "responses": statistics.median(fore),
        "background": statistics.median(back),
    }}))  # fmt: skip
