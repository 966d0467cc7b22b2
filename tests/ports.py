"""Loopback ports for servers a test starts on a port it names beforehand (a subprocess, the
web UI's own listener, a fake MCP server).

A port the kernel gives ``bind(0)`` comes from its ephemeral range, where it also picks the
local port of every outgoing connection: between the probe closing its socket and the
server binding the port, a client connection of the same run may take it (``EADDRINUSE``,
seen once in CI). These ports come from below that range, where nothing is handed out
implicitly, at random (a server a test left behind keeps its port), each checked free by
binding it."""

from __future__ import annotations

import random
import socket

__all__ = ["free_port"]

_LOWEST = 20000
_rng = random.Random()


def _ephemeral_start() -> int:
    """Where the kernel's ephemeral range begins (Linux's default where unreadable)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
            return int(ports.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A loopback port nothing listens on, outside the kernel's ephemeral range."""
    highest = _ephemeral_start() - 1
    if highest > _LOWEST:
        for _ in range(100):
            port = _rng.randint(_LOWEST, highest)
            if _bindable(port):
                return port
    with socket.socket() as sock:  # no room below the range: the kernel's pick
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
