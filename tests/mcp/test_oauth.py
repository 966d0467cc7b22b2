"""OAuth for HTTP MCP servers: ``reveille mcp login`` against a real (small) authorization
server on loopback (``oauth_server.py``), the tokens in the store, read back by the next
start, refreshed when expired, and a server without a login telling the operator to log in.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from pathlib import Path

import aiohttp
import pytest
from mcp.shared.auth import OAuthClientInformationFull, OAuthMetadata, OAuthToken

import storage
from delivery.telegram_backend import TelegramBackend
from reveille.operator_storage import operator_storage
from reveille.settings import load_settings
from tests.mcp.oauth_server import FakeAuthServer, oauth_echo
from tools.mcp.config import McpConfigError, McpServerConfig, parse_servers
from tools.mcp.manager import McpClients
from tools.mcp.oauth import StoredTokens, server_oauth, value_name

NAME = "secure"


def _home(tmp_path: Path, url: str) -> dict[str, str]:
    (tmp_path / "config.toml").write_text(
        f'[mcp.servers.{NAME}]\nurl = "{url}"\nauth = "oauth"\napprovals = "never"\n'
        'scopes = ["echo:read"]\n'
    )
    env = {**os.environ, "REVEILLE_HOME": str(tmp_path)}
    env.pop("REVEILLE_CONFIG", None)
    env.pop("REVEILLE_DATABASE_URL", None)
    return env


def _store(env: dict[str, str]) -> TelegramBackend:
    return operator_storage(load_settings(environ=env)).open_telegram()


async def _login(env: dict[str, str]) -> tuple[int, str, str]:
    """``reveille mcp login`` as an operator runs it, with a browser that opens the URL."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "reveille.cli",
        "mcp",
        "login",
        NAME,
        "--wait",
        "60",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    shown = b""
    while not shown.startswith(b"http"):
        shown = await asyncio.wait_for(proc.stdout.readline(), 60)
        assert shown, "the login ended without printing an authorization URL"
    async with aiohttp.ClientSession() as browser, browser.get(shown.decode().strip()) as page:
        assert page.status == 200
        assert "authorized" in await page.text()
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, shown.decode() + out.decode(), err.decode()


async def _connect(config: McpServerConfig, store: TelegramBackend) -> tuple[str, str]:
    clients = McpClients()
    await clients.start([config], first_connect_seconds=20.0, auth=server_oauth(store))
    try:
        (status,) = clients.servers()
        return status.state, status.last_error
    finally:
        await clients.stop()


def _config(env: dict[str, str]) -> McpServerConfig:
    (config,) = load_settings(environ=env).mcp_servers
    return config


def _expire(store: TelegramBackend, auth: FakeAuthServer) -> str:
    """The stored token as if its time ran out while Reveille was down (the server forgot
    it too); returns the old access token."""
    saved = json.loads(store.platform_value(value_name(NAME, "tokens")) or "{}")
    saved["expires_at"] = 1.0
    store.set_platform_value(value_name(NAME, "tokens"), json.dumps(saved))
    old = str(saved["token"]["access_token"])
    auth.access.discard(old)
    return old


async def test_login_stores_tokens_a_restart_uses_them_and_refreshes(tmp_path: Path) -> None:
    async with oauth_echo() as (auth, url):
        env = _home(tmp_path, url)
        code, out, err = await _login(env)
        assert code == 0, err
        assert "authorize" in out and f"{NAME}: authorized" in out
        assert auth.grants == ["authorization_code"]
        assert auth.scopes == ["echo:read"]  # the server names none: the configured ones
        store = _store(env)
        try:
            saved = json.loads(store.platform_value(value_name(NAME, "tokens")) or "{}")
            token = saved["token"]["access_token"]
            assert token in auth.access and token not in out + err  # never printed
            assert store.platform_value(value_name(NAME, "client"))

            # ``reveille mcp list`` looks with the stored tokens.
            listed = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "reveille.cli",
                "mcp",
                "list",
                env=env,
                stdout=asyncio.subprocess.PIPE,
            )
            shown, _ = await asyncio.wait_for(listed.communicate(), 60)
            assert f"{NAME} (http): ready" in shown.decode()
            assert listed.returncode == 0

            # The next start (another process's store handle) reads the tokens back.
            assert await _connect(_config(env), store) == ("ready", "")
            assert auth.grants == ["authorization_code"]

            old = _expire(store, auth)
            assert await _connect(_config(env), store) == ("ready", "")
            assert auth.grants == ["authorization_code", "refresh_token"]
            renewed = json.loads(store.platform_value(value_name(NAME, "tokens")) or "{}")
            assert renewed["token"]["access_token"] not in ("", old)
        finally:
            store.close()


async def test_a_server_without_a_login_says_to_run_login(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with oauth_echo() as (auth, url):
        env = _home(tmp_path, url)
        store = _store(env)
        try:
            with caplog.at_level(logging.WARNING, logger="tools.mcp.connection"):
                state, error = await _connect(_config(env), store)
        finally:
            store.close()
        assert state == "failed"
        assert f"run reveille mcp login {NAME}" in error
        assert f"run reveille mcp login {NAME}" in caplog.text
        assert auth.grants == []


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ({"command": ["x"], "auth": "oauth"}, "is for url servers"),
        ({"url": "http://h/mcp", "auth": "basic"}, "auth must be none or oauth"),
        ({"url": "http://h/mcp", "client_id": "c"}, 'need auth = "oauth"'),
        (
            {"url": "http://h/mcp", "auth": "oauth", "grant": "client_credentials"},
            "needs client_id and client_secret",
        ),
        (
            {"url": "http://h/mcp", "auth": "oauth", "client_metadata_url": "http://h/c"},
            "https:// URL with a path",
        ),
    ],
)
def test_bad_oauth_settings_say_why(body: dict[str, object], why: str) -> None:
    with pytest.raises(McpConfigError, match=why):
        parse_servers({"servers": {"s": body}}, origin="test", environ={})


def test_oauth_settings_resolve_the_secret_from_the_environment() -> None:
    (config,) = parse_servers(
        {
            "servers": {
                "s": {
                    "url": "https://h/mcp",
                    "auth": "oauth",
                    "grant": "client_credentials",
                    "client_id": "reveille",
                    "client_secret": "${MCP_SECRET}",
                    "scopes": ["read"],
                }
            }
        },
        origin="test",
        environ={"MCP_SECRET": "s3cret"},
    )
    assert (config.grant, config.client_secret, config.scopes) == (
        "client_credentials",
        "s3cret",
        ("read",),
    )
    assert "s3cret" not in repr(config)


@pytest.mark.parametrize("kind", ["sqlite", "memory", "postgres"])
async def test_tokens_and_registration_are_kept_by_every_store(kind: str, tmp_path: Path) -> None:
    if kind == "sqlite":
        location = storage.sqlite_files(chats=tmp_path / "chats.db")
    elif kind == "memory":
        location = storage.open_storage("memory://oauth")
    else:
        from tests.pg_support import fresh_url

        location = storage.open_storage(fresh_url())
    first = location.open_telegram()
    # Another handle on the same store: another server, or the next start (memory: itself).
    second = first if kind == "memory" else location.open_telegram()
    try:
        writer = StoredTokens(first, NAME)
        writer.discovered = lambda: OAuthMetadata.model_validate(
            {
                "issuer": "https://auth.example",
                "authorization_endpoint": "https://auth.example/authorize",
                "token_endpoint": "https://auth.example/token",
            }
        )
        await writer.set_tokens(
            OAuthToken(access_token="a-token", expires_in=60, refresh_token="r-token")
        )
        client = OAuthClientInformationFull.model_validate(
            {"client_id": "c-1", "redirect_uris": ["http://127.0.0.1:9/callback"]}
        )
        await writer.set_client_info(client)

        reader = StoredTokens(second, NAME)
        token = await reader.get_tokens()
        assert token is not None and (token.access_token, token.refresh_token) == (
            "a-token",
            "r-token",
        )
        assert reader.expires_at is not None and reader.expires_at > 0
        assert reader.metadata is not None
        assert str(reader.metadata.token_endpoint) == "https://auth.example/token"
        got = await reader.get_client_info()
        assert got is not None and got.client_id == "c-1"
        await reader.forget_client()
        assert await StoredTokens(first, NAME).get_client_info() is None
        assert await StoredTokens(second, "other").get_tokens() is None
    finally:
        first.close()
        if second is not first:
            second.close()
