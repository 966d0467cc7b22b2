"""Attackers for the connection-limit tests, on raw loopback sockets: connections that send
half a request line and hold, event streams that are opened and held, and the checks that
tell whether the server closed them.

Every 127.0.0.0/8 address is loopback on Linux, so an attacker can come from 127.0.0.2 and
on while the authorised client stays on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

HALF_REQUEST = b"GET / HT"


@dataclass
class Held:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter


def attacker_addresses(first: int, count: int) -> Iterator[str]:
    """``count`` loopback addresses from 127.0.0.<first> on, round and round."""
    while True:
        for i in range(count):
            yield f"127.0.0.{first + i}"


def need_descriptors(count: int) -> None:
    """Lift this process's soft open-file limit to its hard limit; skip when even that
    leaves fewer than ``count`` descriptors."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < count:
        target = count if hard == resource.RLIM_INFINITY else hard
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < count:
        pytest.skip(f"needs {count} open files, the hard limit here is {hard}")


async def hold(
    port: int, count: int, addresses: Iterator[str], payload: bytes = HALF_REQUEST
) -> list[Held]:
    """``count`` connections to ``port``, each sending ``payload`` and then nothing (opened
    16 at a time)."""

    async def one(source: str) -> Held:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
        writer.write(payload)
        return Held(reader, writer)

    held: list[Held] = []
    while len(held) < count:
        batch = min(16, count - len(held))
        held += await asyncio.gather(*(one(next(addresses)) for _ in range(batch)))
    return held


def stream_request(port: int, path: str = "/api/events") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()


async def closed_by_server(conns: list[Held], within: float = 0.0) -> int:
    """How many of ``conns`` the server has closed (end of stream or reset), waiting up to
    ``within`` seconds for the ones still open. Anything the server sent is read past."""
    deadline = time.monotonic() + within

    async def closed(conn: Held) -> bool:
        while True:
            left = max(0.0, deadline - time.monotonic())
            try:
                data = await asyncio.wait_for(conn.reader.read(65536), left or 0.001)
            except TimeoutError:
                return False
            except ConnectionError:
                return True
            if not data:
                return True

    return sum(await asyncio.gather(*(closed(c) for c in conns)))


def release(conns: list[Held]) -> None:
    for conn in conns:
        with contextlib.suppress(Exception):
            conn.writer.transport.abort()


async def timed(call: Callable[[], Awaitable[Any]]) -> tuple[Any, float]:
    """What ``call`` answers and how many seconds it took."""
    start = time.monotonic()
    result = await call()
    return result, time.monotonic() - start
