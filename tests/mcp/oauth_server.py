"""A small real OAuth authorization server (aiohttp, loopback) and the echo MCP server behind
a bearer-token check, for the OAuth tests.

The authorization server implements just enough: RFC 8414 metadata, dynamic client
registration, an authorization endpoint that redirects at once (the person said yes), and
a token endpoint for the authorization code grant (PKCE S256 checked) and for refresh.
The MCP server answers 401 with ``WWW-Authenticate: Bearer resource_metadata=...`` and
serves its RFC 9728 protected resource metadata, accepting only tokens the authorization
server issued and has not seen refreshed away.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import secrets
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import uvicorn
from aiohttp import web

from tests.mcp.echo_server import build

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
Asgi = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass
class FakeAuthServer:
    """The authorization server's state (what the tests look at)."""

    url: str = ""
    expires_in: int = 3600
    clients: dict[str, list[str]] = field(default_factory=dict)  # client id -> redirect uris
    codes: dict[str, tuple[str, str]] = field(default_factory=dict)  # code -> (client, challenge)
    access: set[str] = field(default_factory=set)
    refresh: dict[str, str] = field(default_factory=dict)  # refresh token -> client
    grants: list[str] = field(default_factory=list)  # each token request's grant_type
    scopes: list[str] = field(default_factory=list)  # each authorization request's scope

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/.well-known/oauth-authorization-server", self._metadata)
        app.router.add_post("/register", self._register)
        app.router.add_get("/authorize", self._authorize)
        app.router.add_post("/token", self._token)
        return app

    async def _metadata(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "issuer": self.url,
                "authorization_endpoint": f"{self.url}/authorize",
                "token_endpoint": f"{self.url}/token",
                "registration_endpoint": f"{self.url}/register",
                "response_types_supported": ["code"],
                "grant_types_supported": ["authorization_code", "refresh_token"],
                "code_challenge_methods_supported": ["S256"],
                "token_endpoint_auth_methods_supported": ["none"],
            }
        )

    async def _register(self, request: web.Request) -> web.Response:
        body = await request.json()
        client_id = f"client-{secrets.token_hex(4)}"
        self.clients[client_id] = list(body.get("redirect_uris") or [])
        return web.json_response(
            {**body, "client_id": client_id, "token_endpoint_auth_method": "none"}, status=201
        )

    async def _authorize(self, request: web.Request) -> web.Response:
        query = request.query
        redirect = query.get("redirect_uri", "")
        if redirect not in self.clients.get(query.get("client_id", ""), []):
            return web.Response(status=400, text="unknown client or redirect")
        if query.get("code_challenge_method") != "S256" or not query.get("code_challenge"):
            return web.Response(status=400, text="PKCE S256 required")
        self.scopes.append(query.get("scope", ""))
        code = secrets.token_urlsafe(8)
        self.codes[code] = (query["client_id"], query["code_challenge"])
        back = {"code": code, "state": query.get("state", "")}
        raise web.HTTPFound(f"{redirect}?{urlencode(back)}")

    async def _token(self, request: web.Request) -> web.Response:
        form = await request.post()
        grant = str(form.get("grant_type", ""))
        self.grants.append(grant)
        client = str(form.get("client_id", ""))
        if grant == "authorization_code":
            known = self.codes.pop(str(form.get("code", "")), None)
            verifier = str(form.get("code_verifier", ""))
            digest = hashlib.sha256(verifier.encode()).digest()
            challenge = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
            if known is None or known != (client, challenge):
                return web.json_response({"error": "invalid_grant"}, status=400)
        elif grant == "refresh_token":
            old = str(form.get("refresh_token", ""))
            if self.refresh.pop(old, None) != client:
                return web.json_response({"error": "invalid_grant"}, status=400)
        else:
            return web.json_response({"error": "unsupported_grant_type"}, status=400)
        access, refresh = secrets.token_urlsafe(12), secrets.token_urlsafe(12)
        self.access.add(access)
        self.refresh[refresh] = client
        return web.json_response(
            {
                "access_token": access,
                "token_type": "Bearer",
                "expires_in": self.expires_in,
                "refresh_token": refresh,
            }
        )


def protected(app: Asgi, auth: FakeAuthServer, resource: Callable[[], str]) -> Asgi:
    """``app`` (an MCP server's ASGI app) behind a bearer check against ``auth``'s tokens."""
    metadata_path = "/.well-known/oauth-protected-resource/mcp"

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        if scope["path"] == metadata_path:
            body = f'{{"resource": "{resource()}", "authorization_servers": ["{auth.url}"]}}'
            await _answer(send, 200, body.encode(), [(b"content-type", b"application/json")])
            return
        headers = dict(scope["headers"])
        token = headers.get(b"authorization", b"").decode().removeprefix("Bearer ")
        if token not in auth.access:
            base = resource().rsplit("/mcp", 1)[0]
            challenge = f'Bearer resource_metadata="{base}{metadata_path}"'
            await _answer(send, 401, b"", [(b"www-authenticate", challenge.encode())])
            return
        await app(scope, receive, send)

    return guarded


async def _answer(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@asynccontextmanager
async def oauth_echo() -> AsyncIterator[tuple[FakeAuthServer, str]]:
    """The authorization server and the protected echo MCP server; yields it and the MCP url."""
    auth = FakeAuthServer()
    runner = web.AppRunner(auth.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    auth.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    server = uvicorn.Server(
        uvicorn.Config(
            protected(build().streamable_http_app(), auth, lambda: url),
            log_level="warning",
            lifespan="on",
        )
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.02)
        yield auth, url
    finally:
        server.should_exit = True
        await task
        sock.close()
        await runner.cleanup()
