"""Limits on the connections of Reveille's HTTP ports: caps on how many are open, and
deadlines for the request head, idle time between requests and request bodies.

Both ports (the API server's and the web UI's) listen through a ``ConnectionGuard`` of
their own, which wraps the protocol of every accepted connection before aiohttp sees it:

- **Caps.** At most ``max_connections`` open on the port, at most ``max_per_address`` from
  one client address. A connection over a cap first makes room by closing the connection
  that has been idle longest (between requests, or still sending its first request head):
  of its own address for the address cap, of any address for the port's. When every
  connection in the way is busy in a request, the new one is closed at once, before any of
  its bytes are read. Slow or idle connections thus never lock out a client that sends its
  request promptly, even from the same address.
- **Deadlines.** A connection must send a complete request head within ``header_timeout``
  seconds of connecting (or of the first byte of a later request on it); between requests
  it may stay idle ``idle_timeout`` seconds; a request body must arrive within
  ``body_timeout`` seconds (``request_body.read_json_body`` enforces that one). A request
  in progress (an event stream, a streamed reply) has no deadline here.
- **Sizing.** ``raise_descriptor_limit`` lifts the soft ``RLIMIT_NOFILE`` to the hard limit
  (the composition root does it once at start), and ``ConnectionLimits.for_descriptors``
  sizes the caps from it: a quarter of the descriptors per port (at least 16, at most
  4,096) and an eighth of that per address (8 to 256), so both ports together hold at most
  half of them and the store, upstream model connections and commands keep the rest.

An accept that fails for want of descriptors (``EMFILE``) is asyncio's to handle: it stops
accepting on that socket for a second and tries again; its log lines (Python 3.11 logs one
per connection waiting in the backlog, traceback included) are rate-limited by
``reveille.log_limits``. The guard counts a connection when it is made, after asyncio
accepted a batch of them at once, so that batch is kept at a quarter of the port's cap (16
to 128; the kernel still queues 128): caps plus batches stay under the descriptor limit,
and that path stays the exception. On uvloop, libuv handles ``EMFILE`` itself (it frees a
reserved descriptor to accept and close the queued connections, without a log line).

The guard runs on asyncio's loop and on uvloop's alike: it wraps the protocol, never the
transport, and needs no more of a transport than the ``asyncio.Transport`` methods (uvloop's
do not derive from that class).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web

__all__ = [
    "ConnectionGuard",
    "ConnectionLimits",
    "GuardedSite",
    "descriptor_limit",
    "raise_descriptor_limit",
]

logger = logging.getLogger(__name__)

MIN_PER_PORT = 16
MAX_PER_PORT = 4096
MIN_PER_ADDRESS = 8
MAX_PER_ADDRESS = 256
_FALLBACK_DESCRIPTORS = 1024  # where the platform has no RLIMIT_NOFILE
_UNLIMITED_TARGET = 65536  # what "raise to the hard limit" means when that is unlimited

RequestHandle = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


async def _unwired(request: web.BaseRequest) -> web.StreamResponse:
    raise RuntimeError("the connection guard serves no application before its site starts")


def descriptor_limit() -> int:
    """The soft ``RLIMIT_NOFILE`` of this process (1,024 where there is none)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return _FALLBACK_DESCRIPTORS
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return _FALLBACK_DESCRIPTORS if soft == resource.RLIM_INFINITY else int(soft)


def raise_descriptor_limit() -> int:
    """Lift the soft ``RLIMIT_NOFILE`` to the hard limit; the soft limit now in force.

    An unlimited hard limit is taken as 65,536 (some systems refuse an unlimited soft one);
    a refusal leaves the limit as it was."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return _FALLBACK_DESCRIPTORS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _UNLIMITED_TARGET if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            logger.warning(
                "could not raise the open-file limit from %d to %d: %s", soft, target, exc
            )
    return descriptor_limit()


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The caps and deadlines of one port (see the module docstring)."""

    max_connections: int = 256
    max_per_address: int = 32
    header_timeout: float = 10.0
    idle_timeout: float = 75.0
    body_timeout: float = 30.0

    def __post_init__(self) -> None:
        if self.max_connections < 1 or self.max_per_address < 1:
            raise ValueError("connection caps must be at least 1")
        if min(self.header_timeout, self.idle_timeout, self.body_timeout) <= 0:
            raise ValueError("connection timeouts must be positive")

    @classmethod
    def for_descriptors(cls, descriptors: int, **timeouts: float) -> ConnectionLimits:
        """Caps sized from a descriptor limit: a quarter of it per port (16 to 4,096), an
        eighth of that per address (8 to 256)."""
        per_port = min(MAX_PER_PORT, max(MIN_PER_PORT, descriptors // 4))
        per_address = min(MAX_PER_ADDRESS, max(MIN_PER_ADDRESS, per_port // 8))
        return cls(max_connections=per_port, max_per_address=min(per_address, per_port), **timeouts)

    @classmethod
    def for_this_process(cls) -> ConnectionLimits:
        """Caps sized from this process's current descriptor limit."""
        return cls.for_descriptors(descriptor_limit())


class _Connection(asyncio.Protocol):
    """One accepted connection: counts itself with the guard, then hands everything to
    aiohttp's protocol (``inner``); refused, it never reaches aiohttp."""

    __slots__ = (
        "address",
        "admitted",
        "busy",
        "deadline",
        "guard",
        "inner",
        "transport",
        "waiting_head",
    )

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self.guard = guard
        self.inner = inner
        self.transport: asyncio.Transport | None = None
        self.address = ""
        self.busy = 0  # requests in progress (aiohttp handles one at a time)
        self.deadline = 0.0
        self.waiting_head = True  # the deadline is the header timeout's
        self.admitted = False  # aiohttp's protocol was told the connection began

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Not an ``isinstance`` check: uvloop's transports are transports in every respect
        # but do not derive from ``asyncio.Transport``.
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.address = str(peer[0]) if isinstance(peer, tuple) and peer else str(peer or "")
        if not self.guard._admit(self):
            self.transport.abort()
            return
        self.admitted = True
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self.busy and not self.waiting_head:
            # The first byte of another request: its head is due within the header timeout.
            self.waiting_head = True
            due = time.monotonic() + self.guard.limits.header_timeout
            if due < self.deadline:
                self.deadline = due
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.guard._forget(self)
        if self.admitted:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


class ConnectionGuard:
    """The caps and deadlines of one port's connections (see the module docstring).

    Listen with ``GuardedSite``: it wraps aiohttp's protocol (``protocol_factory``) and the
    server's request handler (``tracking``: when a connection is busy in a request)."""

    def __init__(self, limits: ConnectionLimits, *, name: str = "HTTP") -> None:
        self.limits = limits
        self.name = name
        self.refused = 0
        self.evicted = 0
        self.timed_out = 0
        self._open: dict[asyncio.BaseTransport, _Connection] = {}
        self._per_address: dict[str, int] = {}
        # Connections not busy in a request, longest idle first: all, and by address.
        self._idle: OrderedDict[_Connection, None] = OrderedDict()
        self._idle_by_address: dict[str, OrderedDict[_Connection, None]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._handle: RequestHandle = _unwired

    @property
    def open_connections(self) -> int:
        return len(self._open)

    @property
    def busy_connections(self) -> int:
        """Connections with a request in progress."""
        return len(self._open) - len(self._idle)

    def open_from(self, address: str) -> int:
        return self._per_address.get(address, 0)

    # ----------------------------------------------------------------- wiring

    def tracking(self, handle: RequestHandle) -> RequestHandle:
        """``handle`` (the server's request handler) telling the guard when a connection
        is busy in a request: one wrapper around the whole application, not a middleware
        layer (which aiohttp dresses in more calls per request)."""
        if getattr(handle, "__self__", None) is self:
            return handle  # already this guard's (a second site on the same runner)
        self._handle = handle
        return self._track_requests

    def protocol_factory(self, server: Callable[[], asyncio.Protocol]) -> Callable[[], _Connection]:
        """What the listening socket makes a protocol with: aiohttp's, guarded."""
        return lambda: _Connection(self, server())

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._schedule_sweep()

    def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        self._loop = None

    async def _track_requests(self, request: web.BaseRequest) -> web.StreamResponse:
        transport = request.transport
        conn = self._open.get(transport) if transport is not None else None
        if conn is None:
            return await self._handle(request)
        # Busy while a request runs; idle again, with the idle timeout, after its last one.
        conn.busy += 1
        self._mark_busy(conn)
        try:
            return await self._handle(request)
        finally:
            conn.busy -= 1
            if (
                not conn.busy
                and conn.transport is not None
                and self._open.get(conn.transport) is conn
            ):
                conn.deadline = time.monotonic() + self.limits.idle_timeout
                conn.waiting_head = False
                self._mark_idle(conn)

    # ----------------------------------------------------------------- bookkeeping

    @staticmethod
    def _now() -> float:
        # The monotonic clock itself, not the loop's ``time()`` (the same clock for
        # asyncio's loop, but a Python call per read): deadlines only compare with it.
        return time.monotonic()

    def _admit(self, conn: _Connection) -> bool:
        limits = self.limits
        address = conn.address
        if self._per_address.get(address, 0) >= limits.max_per_address and not self._evict(
            self._idle_by_address.get(address), "address"
        ):
            return self._refuse(conn, "from that address")
        if len(self._open) >= limits.max_connections and not self._evict(self._idle, "port"):
            return self._refuse(conn, "on the port")
        assert conn.transport is not None
        self._open[conn.transport] = conn
        self._per_address[address] = self._per_address.get(address, 0) + 1
        conn.deadline = self._now() + limits.header_timeout
        conn.waiting_head = True
        self._mark_idle(conn)
        return True

    def _refuse(self, conn: _Connection, where: str) -> bool:
        self.refused += 1
        logger.warning(
            "%s: refused a connection from %s, every connection %s is busy "
            "(%d open on the port, %d from that address; caps %d and %d)",
            self.name,
            conn.address,
            where,
            len(self._open),
            self._per_address.get(conn.address, 0),
            self.limits.max_connections,
            self.limits.max_per_address,
        )
        return False

    def _evict(self, idle: OrderedDict[_Connection, None] | None, cap: str) -> bool:
        """Close the connection idle longest in ``idle``; False when there is none."""
        if not idle:
            return False
        victim = next(iter(idle))
        self.evicted += 1
        logger.info(
            "%s: closed the connection idle longest (from %s) to admit a new one at the %s cap",
            self.name,
            victim.address,
            cap,
        )
        self._close(victim)
        return True

    def _close(self, conn: _Connection) -> None:
        """Uncount ``conn`` now (its place is free at once) and close it; aiohttp's protocol
        hears ``connection_lost`` from the transport as usual."""
        self._forget(conn)
        if conn.transport is not None:
            conn.transport.close()

    def _forget(self, conn: _Connection) -> None:
        """Uncount a connection that ended or is being closed (once)."""
        if conn.transport is None or self._open.get(conn.transport) is not conn:
            return
        del self._open[conn.transport]
        count = self._per_address.get(conn.address, 0) - 1
        if count > 0:
            self._per_address[conn.address] = count
        else:
            self._per_address.pop(conn.address, None)
        self._mark_busy(conn)

    def _mark_idle(self, conn: _Connection) -> None:
        self._idle[conn] = None
        self._idle.move_to_end(conn)
        by_address = self._idle_by_address.setdefault(conn.address, OrderedDict())
        by_address[conn] = None
        by_address.move_to_end(conn)

    def _mark_busy(self, conn: _Connection) -> None:
        self._idle.pop(conn, None)
        by_address = self._idle_by_address.get(conn.address)
        if by_address is not None:
            by_address.pop(conn, None)
            if not by_address:
                del self._idle_by_address[conn.address]

    # ----------------------------------------------------------------- deadlines

    def _schedule_sweep(self) -> None:
        if self._loop is None:
            return
        every = min(1.0, self.limits.header_timeout / 4, self.limits.idle_timeout / 4)
        self._sweeper = self._loop.call_later(every, self._sweep)

    def _sweep(self) -> None:
        now = self._now()
        slow = [conn for conn in self._idle if conn.deadline <= now]
        heads = sum(conn.waiting_head for conn in slow)
        for conn in slow:
            self._close(conn)
        self.timed_out += len(slow)
        if heads:
            logger.info(
                "%s: closed %d connection(s) that sent no complete request head within %g s",
                self.name,
                heads,
                self.limits.header_timeout,
            )
        self._schedule_sweep()


class GuardedSite(web.BaseSite):
    """aiohttp's ``TCPSite`` with every connection passing through a ``ConnectionGuard``
    (``reuse_port``: several worker processes listen on the port)."""

    def __init__(
        self,
        runner: web.BaseRunner,
        guard: ConnectionGuard,
        host: str,
        port: int,
        *,
        reuse_port: bool = False,
        backlog: int = 128,
    ) -> None:
        super().__init__(runner, backlog=backlog)
        self.guard = guard
        self._host = host
        self._port = port
        self._reuse_port = reuse_port
        # asyncio accepts up to this many connections at once (its ``backlog``) before the
        # guard counts any of them: under a small descriptor limit that batch must be small,
        # while the kernel's queue keeps ``backlog`` so that bursts are not dropped.
        self.accept_batch = min(backlog, max(MIN_PER_PORT, guard.limits.max_connections // 4))

    @property
    def name(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self._port}"

    @property
    def port(self) -> int:
        """The bound port (the one asked for, until it listens)."""
        return self._port

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        server: Any = self._runner.server
        assert server is not None
        server.request_handler = self.guard.tracking(server.request_handler)
        self._server = await loop.create_server(
            self.guard.protocol_factory(server),
            self._host,
            self._port,
            backlog=self.accept_batch,
            reuse_port=self._reuse_port or None,
        )
        for listening in self._server.sockets:
            # The kernel's queue back to the full backlog (asyncio listened with the batch
            # size): listen() again on a duplicate of the listening descriptor.
            with socket.socket(fileno=os.dup(listening.fileno())) as same:
                same.listen(self._backlog)
        if self._server.sockets:
            self._port = int(self._server.sockets[0].getsockname()[1])
        self.guard.start(loop)

    async def stop(self) -> None:
        self.guard.stop()
        await super().stop()
