"""Slow and numerous clients on the API server's port (issue 20, items 1 and 3).

Each test plays the attack first: connections that send half a request line and hold it,
far more of them than the caps, a body that stalls, and (in a real `reveille serve` under
an open-file limit of 256) a flood past that limit and an accept loop out of descriptors.
What must hold: an authorised client still gets its answers, the slow connections are
closed (over the caps at once, the rest after the header timeout), and the log stays small
with no traceback per connection.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import urllib.request
from pathlib import Path

import aiohttp
import pytest

from gateway.http.connection_guard import ConnectionLimits, raise_descriptor_limit
from gateway.session import SessionStore
from tests.api_server._support import KEY, running_adapter
from tests.api_server.serve_support import KEY as SERVE_KEY
from tests.api_server.serve_support import Server
from tests.event_loops import available_loops
from tests.ports import free_port
from tests.slow_clients import (
    attacker_addresses,
    closed_by_server,
    hold,
    need_descriptors,
    release,
    stream_request,
    timed,
)

AUTH = {"Authorization": f"Bearer {KEY}"}
CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=5)  # generous: a loaded 2-core machine


async def health(port: int, source: str = "127.0.0.1") -> int:
    connector = aiohttp.TCPConnector(local_addr=(source, 0))
    async with (
        aiohttp.ClientSession(connector=connector, timeout=CLIENT_TIMEOUT) as http,
        http.get(f"http://127.0.0.1:{port}/health", headers=AUTH) as resp,
    ):
        assert (await resp.json())["status"] == "ok"
        return resp.status


@pytest.mark.both_loops
async def test_half_sent_heads_and_idle_connections_are_closed_on_time(
    store: SessionStore,
) -> None:
    limits = ConnectionLimits(header_timeout=0.5, idle_timeout=1.0)
    async with running_adapter(store, connection_limits=limits) as (adapter, _, _):
        slow = await hold(adapter.port, 20, attacker_addresses(2, 1))
        silent = await hold(adapter.port, 5, attacker_addresses(3, 1), payload=b"")
        # A complete request, answered; then the connection idles between requests.
        idle = await hold(
            adapter.port, 1, attacker_addresses(4, 1), stream_request(adapter.port, "/health")
        )
        try:
            assert await closed_by_server(slow + silent, within=10) == 25
            assert (await idle[0].reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
            assert await closed_by_server(idle, within=10) == 1
            assert adapter.connections.timed_out == 26
            assert adapter.connections.open_connections == 0
            assert await health(adapter.port) == 200
        finally:
            release(slow + silent + idle)


@pytest.mark.both_loops
async def test_a_thousand_slow_connections_do_not_lock_out_an_authorised_client(
    store: SessionStore,
) -> None:
    need_descriptors(4096)
    limits = ConnectionLimits(max_connections=128, max_per_address=32, header_timeout=60)
    async with running_adapter(store, connection_limits=limits) as (adapter, _, _):
        guard = adapter.connections
        # The attack: 1,000 half-sent request lines from ten addresses, all held.
        slow = await hold(adapter.port, 1000, attacker_addresses(2, 10))
        try:
            # Over the caps, the connections idle longest were closed to make room.
            assert guard.open_connections <= 128
            assert all(guard.open_from(f"127.0.0.{2 + i}") <= 32 for i in range(10))
            assert await closed_by_server(slow, within=5) >= 1000 - 128
            # An authorised client still gets answers, from its own address and from one
            # an attacker fills (idle connections yield to it).
            for source in ("127.0.0.1", "127.0.0.2", "127.0.0.1"):
                status, seconds = await timed(lambda s=source: health(adapter.port, s))
                assert status == 200
                print(f"authorised answer from {source}: {seconds:.3f} s")
            connector = aiohttp.TCPConnector(force_close=True)
            async with aiohttp.ClientSession(connector=connector, timeout=CLIENT_TIMEOUT) as http:
                body = {
                    "model": "reveille-demo",
                    "messages": [{"role": "user", "content": "hello"}],
                }
                async with http.post(
                    f"http://127.0.0.1:{adapter.port}/v1/chat/completions", json=body, headers=AUTH
                ) as resp:
                    assert resp.status == 200, await resp.text()
            assert guard.refused == 0  # every place was taken by an idle connection
        finally:
            release(slow)


@pytest.mark.both_loops
async def test_a_stalled_body_is_a_408_not_a_held_connection(store: SessionStore) -> None:
    limits = ConnectionLimits(body_timeout=0.5)
    async with running_adapter(store, connection_limits=limits) as (adapter, _, _):
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
            "Content-Length: 1000\r\n\r\n"
        ).encode()
        stalled = await hold(adapter.port, 1, attacker_addresses(2, 1), head + b'{"model": ')
        try:
            answer = await asyncio.wait_for(stalled[0].reader.readuntil(b"\r\n\r\n"), 10)
            assert answer.startswith(b"HTTP/1.1 408"), answer
            length = int(re.search(rb"Content-Length: (\d+)", answer).group(1))  # type: ignore[union-attr]
            error = json.loads(await stalled[0].reader.readexactly(length))["error"]
            assert error["code"] == "request_timeout"
        finally:
            release(stalled)


def _get(url: str, headers: dict[str, str] | None = None) -> int:
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=5) as resp:
        return int(resp.status)


def _fds(server: Server) -> list[str]:
    """The open descriptors of the server's process."""
    return os.listdir(f"/proc/{server.proc.pid}/fd")


async def _answers(port: int, webui_port: int) -> float:
    """Both ports answer an authorised client (5 s timeout each); the slower's seconds
    (once out of descriptors, asyncio accepts again a second later)."""
    auth = {"Authorization": f"Bearer {SERVE_KEY}"}
    api = f"http://127.0.0.1:{port}/health"
    web = f"http://127.0.0.1:{webui_port}/api/bootstrap"
    (a, api_s), (b, web_s) = [
        await timed(lambda u=url, h=headers: asyncio.to_thread(_get, u, h))
        for url, headers in ((api, auth), (web, {}))
    ]
    assert a == 200 and b == 200
    return max(api_s, web_s)


@pytest.mark.parametrize("event_loop_name", list(available_loops()))
async def test_a_flood_past_the_descriptor_limit_leaves_the_server_answering(
    tmp_path: Path, event_loop_name: str
) -> None:
    """A real `reveille serve` with an open-file limit of 256 (so 64 connections per port,
    8 per address, 32 event streams): 1,000 half-sent request lines on each port and 1,000
    event streams, held; then every descriptor of the server taken (EMFILE on accept, and
    on everything else) while 300 more connect. It answers throughout the first and after
    the second, and logs under 1 MB, with no traceback per connection."""
    need_descriptors(8192)
    webui_port = free_port()
    server = Server(
        tmp_path,
        extra_env={
            "REVEILLE_TEST_NOFILE": "256",
            "REVEILLE_TEST_FD_HOG": "1",
            "REVEILLE_WEBUI_PORT": str(webui_port),
            "REVEILLE_EVENT_LOOP": event_loop_name,
        },
    )
    held = []
    try:
        server.wait_for(re.compile(r"open-file limit 256: at most 64 connections per port"))
        # The attack: half-sent request lines on both ports, event streams on the web UI's.
        for port in (server.port, webui_port):
            held += await hold(port, 1000, attacker_addresses(2, 10))
        held += await hold(webui_port, 1000, attacker_addresses(12, 10), stream_request(webui_port))
        under_flood = await _answers(server.port, webui_port)
        assert await closed_by_server(held, within=2) >= 3000 - 2 * 64
        release(held)
        held = []

        # Every descriptor taken once the server let go of the flood: accepts fail with
        # EMFILE while 300 more connections queue up.
        for _ in range(300):
            if len(_fds(server)) <= 64:
                break
            await asyncio.sleep(0.1)
        server.proc.send_signal(signal.SIGUSR1)
        server.wait_for(re.compile(r"HOGGED \d+"))
        addresses = attacker_addresses(2, 10)
        queued = [
            asyncio.create_task(
                asyncio.open_connection("127.0.0.1", server.port, local_addr=(next(addresses), 0))
            )
            for _ in range(300)
        ]
        await asyncio.sleep(3.5)  # asyncio retries the accept every second
        for task in queued:
            task.cancel()
        results = await asyncio.gather(*queued, return_exceptions=True)
        for result in results:
            if isinstance(result, tuple):
                result[1].transport.abort()
        server.proc.send_signal(signal.SIGUSR2)
        server.wait_for(re.compile(r"RELEASED"))
        after_emfile = await _answers(server.port, webui_port)
        print(f"authorised answers: {under_flood:.3f} s under the flood, {after_emfile:.3f} s")
    finally:
        release(held)
        server.stop()
    log = "".join(server.lines)
    if event_loop_name == "asyncio":
        # asyncio logs its EMFILE path; libuv (uvloop) takes its own silently (it closes a
        # reserved descriptor to accept and close the queued connections).
        assert "out of system resource" in log
    assert len(log.encode()) < 1_000_000, len(log)
    # One traceback at most per condition (a listening socket's failed accept), never one
    # per connection or per attempt.
    assert log.count("Traceback") <= 2, log[-5000:]
    print(f"server log: {len(log.encode())} bytes, {log.count(chr(10))} lines")


def test_raising_the_descriptor_limit_reaches_the_hard_limit() -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft > 64:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft // 2, hard))
    raised = raise_descriptor_limit()
    assert raised == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert raised >= soft
    assert hard == resource.RLIM_INFINITY or raised == hard


def test_caps_are_sized_from_the_descriptor_limit() -> None:
    sized = {
        n: (lim.max_connections, lim.max_per_address)
        for n in (64, 256, 1024, 20_000, 1 << 20)
        for lim in [ConnectionLimits.for_descriptors(n)]
    }
    assert sized == {
        64: (16, 8),
        256: (64, 8),
        1024: (256, 32),
        20_000: (4096, 256),
        1 << 20: (4096, 256),
    }
