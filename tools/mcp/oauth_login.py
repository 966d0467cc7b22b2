"""The person's part of an OAuth authorization code grant (``reveille mcp login NAME``).

``LoopbackCallback`` listens on a loopback port for the authorization server's redirect
(``/callback?code=...&state=...``); ``login`` connects to the MCP server with the store's
OAuth (``tools.mcp.oauth``), prints the authorization URL when the server asks for one,
waits for the redirect, and leaves the tokens in the store. The SDK checks the state and
the issuer of the redirect; the code itself is never printed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import httpx2
from aiohttp import web
from mcp.shared.auth import AuthorizationCodeResult

from tools.mcp.config import McpServerConfig
from tools.mcp.manager import McpClients
from tools.mcp.oauth import StoredTokens, ValueStore, oauth_for

CALLBACK_PATH = "/callback"


class LoginFailed(Exception):
    """The authorization server sent the person back with an error (or never did)."""


class LoopbackCallback:
    """An HTTP listener on 127.0.0.1 for the one redirect a login waits for."""

    def __init__(self) -> None:
        self.port = 0
        self._answer: asyncio.Future[AuthorizationCodeResult] | None = None

    @property
    def redirect_uri(self) -> str:
        return f"http://127.0.0.1:{self.port}{CALLBACK_PATH}"

    @contextlib.asynccontextmanager
    async def listening(self, port: int = 0) -> AsyncIterator[LoopbackCallback]:
        app = web.Application()
        app.router.add_get(CALLBACK_PATH, self._redirected)
        runner = web.AppRunner(app, access_log=None)  # its query holds the code
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", port)
        await site.start()
        self.port = int(runner.addresses[0][1])
        self._answer = asyncio.get_running_loop().create_future()
        try:
            yield self
        finally:
            await runner.cleanup()

    async def _redirected(self, request: web.Request) -> web.Response:
        query = request.query
        answer = self._answer
        if answer is None or answer.done():
            return web.Response(status=409, text="No login is waiting for this redirect.\n")
        if "error" in query:
            answer.set_exception(LoginFailed(f"the authorization server said {query['error']!r}"))
            return web.Response(status=400, text="Reveille was not authorized.\n")
        answer.set_result(
            AuthorizationCodeResult(
                code=query.get("code", ""), state=query.get("state"), iss=query.get("iss")
            )
        )
        return web.Response(text="Reveille is authorized: you can close this page.\n")

    async def wait(self) -> AuthorizationCodeResult:
        if self._answer is None:
            raise LoginFailed("the callback is not listening")
        result = await self._answer
        # A second authorization in this login (a scope step-up) waits for a new redirect.
        self._answer = asyncio.get_running_loop().create_future()
        return result


@dataclass(frozen=True)
class LoginResult:
    ok: bool
    detail: str  # the server's state and error, or its tool count


async def login(
    config: McpServerConfig,
    store: ValueStore,
    *,
    show: Callable[[str], None],
    port: int = 0,
    wait_seconds: float = 300.0,
) -> LoginResult:
    """Authorize Reveille with ``config``'s server: ``show`` is given the URL to open.
    Tokens (and a registration) end in ``store``; a valid stored token needs no person."""
    callback = LoopbackCallback()
    async with callback.listening(port):
        if not config.client_id:
            # A registration names the redirect address: one made for another port would be
            # refused, so this login registers again.
            stored = await StoredTokens(store, config.name).get_client_info()
            uris = [str(uri) for uri in (stored.redirect_uris or [])] if stored else []
            if stored is not None and callback.redirect_uri not in uris:
                await StoredTokens(store, config.name).forget_client()

        async def redirect(url: str) -> None:
            show(url)

        def auth(server: McpServerConfig) -> httpx2.Auth | None:
            return oauth_for(
                server,
                store,
                redirect_uri=callback.redirect_uri,
                redirect_handler=redirect,
                callback_handler=callback.wait,
            )

        clients = McpClients()
        await clients.start([config], first_connect_seconds=wait_seconds, auth=auth)
        try:
            (status,) = clients.servers()
        finally:
            await clients.stop()
    if status.state != "ready":
        return LoginResult(False, f"{status.state}: {status.last_error}")
    return LoginResult(True, f"{len(status.tools)} tool(s)")
