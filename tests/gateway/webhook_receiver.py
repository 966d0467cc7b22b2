"""A webhook receiver as a real HTTP server on a loopback port, for the webhook tests.

It records every request (headers and body as received) and answers with ``status``
(settable while it runs, with ``answer_headers``) or, while ``stall`` is set, holds the
request until ``release()``.
It keeps the ``webhook-id``s it accepted, as a receiver that dedupes on them would.
``stop()`` then ``start()`` again takes it off the network and back on the
same port (a receiver that is down for a while).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiohttp import web


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes


@dataclass
class WebhookReceiver:
    status: int = 200
    port: int = 0
    received: list[Received] = field(default_factory=list)
    accepted_ids: list[str] = field(default_factory=list)  # first sight of each id, in order
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    # While set, requests are recorded and then held unanswered (a receiver that hangs).
    stall: bool = False
    answer_headers: dict[str, str] = field(default_factory=dict)  # on every answer
    _released: asyncio.Event = field(default_factory=asyncio.Event)
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        headers = {k.lower(): v for k, v in request.headers.items()}
        self.received.append(Received(headers, body))
        self.arrived.set()
        if self.stall:
            await self._released.wait()
            return web.Response(status=503)  # its sender is gone: nobody reads this
        if 200 <= self.status < 300:
            msg_id = headers.get("webhook-id", "")
            if msg_id not in self.accepted_ids:
                self.accepted_ids.append(msg_id)
        return web.Response(status=self.status, headers=self.answer_headers)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/hook", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True)
        await site.start()
        if not self.port:
            server = site._server
            assert server is not None
            self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def release(self) -> None:
        """Stop stalling; the requests held so far are answered 503."""
        self.stall = False
        self._released.set()

    async def stop(self) -> None:
        self._released.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def wait_for(self, count: int, *, timeout: float = 30.0) -> None:
        """Until at least ``count`` requests arrived (a deadline, not a speed claim)."""
        async with asyncio.timeout(timeout):
            while len(self.received) < count:
                self.arrived.clear()
                await self.arrived.wait()
