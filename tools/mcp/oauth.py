"""OAuth for streamable-HTTP MCP servers (``[mcp.servers.NAME] auth = "oauth"``).

The SDK's ``OAuthClientProvider`` (``mcp.client.auth``) does the protocol: protected resource
metadata (RFC 9728), authorization server metadata (RFC 8414 / OpenID), dynamic client
registration or a URL-based client id, PKCE, the ``resource`` parameter, scopes from
``WWW-Authenticate``, step-up and refresh. This module gives it what is Reveille's:

- the store (``StoredTokens``): the tokens and the client registration of each server are
  small values in the store's key-value table (``platform_value``: SQLite, PostgreSQL and
  memory alike), so every Reveille server sharing the store, and the next start, finds
  them; a token's expiry is kept as a time, so a token that expired while Reveille was
  down is refreshed rather than tried;
- who authorizes: a server (``serve``) has no person at hand, so an authorization code
  grant that needs one fails the connection with ``LoginNeeded`` (the log says "run
  reveille mcp login NAME"); ``reveille mcp login`` passes its own handlers (it prints the
  URL and waits on a loopback callback). ``grant = "client_credentials"`` needs nobody.

Tokens and secrets are never logged.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Literal, Protocol

import httpx2
from mcp.client.auth import OAuthClientProvider, TokenStorage
from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthMetadata,
    OAuthToken,
)

from tools.mcp.config import McpServerConfig

CLIENT_NAME = "Reveille"
# The redirect a registration names when no login is running (a server's own connection
# never redirects; ``reveille mcp login`` registers its real callback).
DEFAULT_REDIRECT = "http://127.0.0.1:33418/callback"

RedirectHandler = Callable[[str], Awaitable[None]]
CallbackHandler = Callable[[], Awaitable[AuthorizationCodeResult]]


class ValueStore(Protocol):
    """The store's small named values (``delivery.telegram_backend``'s key-value table)."""

    def platform_value(self, name: str) -> str | None: ...

    def set_platform_value(
        self, name: str, value: str, *, written_at: float | None = None
    ) -> None: ...


class LoginNeeded(Exception):
    """The server wants a person to authorize Reveille; ``reveille mcp login NAME`` does."""

    def __init__(self, server: str) -> None:
        super().__init__(
            f"MCP server {server} needs an OAuth authorization: run reveille mcp login {server}"
        )
        self.server = server


def value_name(server: str, what: str) -> str:
    """The store's name for ``what`` (``tokens`` or ``client``) of MCP server ``server``."""
    return f"mcp.oauth.{server}.{what}"


class StoredTokens(TokenStorage):
    """One server's tokens and client registration, in the store (a thread does the I/O).

    ``preset`` is a configured client (``client_id``): it is what ``get_client_info``
    answers when the store holds no registration of its own."""

    def __init__(
        self,
        store: ValueStore,
        server: str,
        *,
        preset: OAuthClientInformationFull | None = None,
    ) -> None:
        self._store = store
        self._server = server
        self._preset = preset
        self.expires_at: float | None = None  # of the tokens last read or written
        # The authorization server's metadata, kept with the tokens: a refresh after a
        # restart must reach the token endpoint discovered before, not guess one.
        self.metadata: OAuthMetadata | None = None
        self.discovered: Callable[[], OAuthMetadata | None] = lambda: None

    async def get_tokens(self) -> OAuthToken | None:
        text = await self._read("tokens")
        if text is None:
            return None
        saved = json.loads(text)
        token = OAuthToken.model_validate(saved["token"])
        expires_at = saved.get("expires_at")
        self.expires_at = float(expires_at) if expires_at is not None else None
        metadata = saved.get("metadata")
        self.metadata = None if metadata is None else OAuthMetadata.model_validate(metadata)
        return token

    async def set_tokens(self, tokens: OAuthToken) -> None:
        # ``expires_in`` counts from the answer: the time it ends is what a restart needs.
        self.expires_at = time.time() + tokens.expires_in if tokens.expires_in else None
        metadata = self.discovered() or self.metadata
        saved = {
            "token": tokens.model_dump(mode="json"),
            "expires_at": self.expires_at,
            "metadata": None if metadata is None else metadata.model_dump(mode="json"),
        }
        await self._write("tokens", json.dumps(saved))

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        text = await self._read("client")
        if text is None:
            return self._preset
        return OAuthClientInformationFull.model_validate_json(text)

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        await self._write("client", client_info.model_dump_json(exclude_none=True))

    async def forget_client(self) -> None:
        """Drop the stored registration (a login whose callback address changed registers
        again)."""
        await self._write("client", "")

    async def _read(self, what: str) -> str | None:
        text = await asyncio.to_thread(self._store.platform_value, value_name(self._server, what))
        return text or None

    async def _write(self, what: str, text: str) -> None:
        await asyncio.to_thread(
            self._store.set_platform_value, value_name(self._server, what), text
        )


class _KeepsExpiry(OAuthClientProvider):
    """Loads the stored expiry and token endpoint with the stored tokens (the SDK's
    ``_initialize`` keeps only the tokens, so a token that expired while Reveille was down
    would be sent as valid and refused, and its refresh sent to the MCP server's origin).

    ``fallback_scope`` (``scopes``) is asked for when the server names no scope: the SDK
    chooses the scope from the server's challenge and metadata, and omits it otherwise."""

    fallback_scope: str | None = None

    async def _perform_authorization(self) -> httpx2.Request:
        if not self.context.client_metadata.scope and self.fallback_scope:
            self.context.client_metadata.scope = self.fallback_scope
        return await super()._perform_authorization()

    async def _initialize(self) -> None:
        await super()._initialize()
        storage = self.context.storage
        if isinstance(storage, StoredTokens):
            storage.discovered = lambda: self.context.oauth_metadata
            self.context.token_expiry_time = storage.expires_at
            if self.context.oauth_metadata is None:
                self.context.oauth_metadata = storage.metadata


class CodeGrantAuth(_KeepsExpiry):
    """The authorization code grant (PKCE), with Reveille's storage."""


class ClientCredentialsAuth(_KeepsExpiry, ClientCredentialsOAuthProvider):
    """The client credentials grant, with Reveille's storage."""


def uses_oauth(configs: Iterable[McpServerConfig]) -> bool:
    """Whether a server of ``configs`` takes OAuth (the composition root opens the store's
    values for them then)."""
    return any(config.auth == "oauth" for config in configs)


def server_oauth(store: ValueStore | None) -> Callable[[McpServerConfig], httpx2.Auth | None]:
    """``McpClients.start``'s ``auth`` for ``serve``: the store's tokens, no person."""
    return lambda config: None if store is None else oauth_for(config, store)


def oauth_for(
    config: McpServerConfig,
    store: ValueStore,
    *,
    redirect_uri: str = DEFAULT_REDIRECT,
    redirect_handler: RedirectHandler | None = None,
    callback_handler: CallbackHandler | None = None,
) -> httpx2.Auth | None:
    """The ``auth=`` of ``config``'s HTTP client (None: the server takes no OAuth). Without
    handlers a grant that needs a person fails with ``LoginNeeded``."""
    if config.auth != "oauth":
        return None
    scope = " ".join(config.scopes) or None
    if config.grant == "client_credentials":
        machine = ClientCredentialsAuth(
            server_url=config.url,
            storage=StoredTokens(store, config.name),
            client_id=config.client_id,
            client_secret=config.client_secret,
            scope=scope,
        )
        machine.fallback_scope = scope
        return machine
    method: Literal["client_secret_basic", "none"] = (
        "client_secret_basic" if config.client_secret else "none"
    )
    preset = None
    if config.client_id:
        preset = OAuthClientInformationFull(
            client_id=config.client_id,
            client_secret=config.client_secret or None,
            redirect_uris=[redirect_uri],  # type: ignore[list-item]  # pydantic parses it
            token_endpoint_auth_method=method,
            scope=scope,
        )
    metadata = OAuthClientMetadata(
        client_name=CLIENT_NAME,
        redirect_uris=[redirect_uri],  # type: ignore[list-item]  # pydantic parses it
        grant_types=["authorization_code", "refresh_token"],
        token_endpoint_auth_method=method if config.client_id else None,
        scope=scope,
    )

    async def no_person(url: str) -> None:
        raise LoginNeeded(config.name)

    async def no_callback() -> AuthorizationCodeResult:
        raise LoginNeeded(config.name)

    person = CodeGrantAuth(
        config.url,
        metadata,
        StoredTokens(store, config.name, preset=preset),
        redirect_handler=redirect_handler or no_person,
        callback_handler=callback_handler or no_callback,
        client_metadata_url=config.client_metadata_url or None,
    )
    person.fallback_scope = scope
    return person
