"""The login rate limit never locks the right password out.

The limit was per address, and refused everything from a limited address: anyone on the
same address (or, behind a reverse proxy, anyone at all) could keep the owner out with five
wrong passwords a minute. Now a browser that has logged in before carries a signed
known-browser cookie, and its attempts are counted on their own: an attacker's failures do
not touch it. Behind a proxy, the client's address comes from ``X-Forwarded-For`` only when
the proxy is in ``[webui] trusted_proxies``; otherwise that header is ignored (spoofing it
escapes nothing).
"""

from __future__ import annotations

import aiohttp

from api.auth import DEVICE_COOKIE_NAME
from tests.webui.conftest import Web, settings_for, start_web, stop_web


async def _login(web: Web, password: str, **headers: str) -> int:
    r = await web.post("/api/login", {"password": password}, headers=headers)
    if r.status == 200:
        web.csrf = (await r.json())["csrf_token"]
    return r.status


async def _attacker(web: Web) -> Web:
    """Another client of the same address, without the owner's cookies."""
    http = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))
    other = Web(web.app, web.server, http, web.stack)
    boot = await (await other.get("/api/bootstrap")).json()
    other.csrf = boot["csrf_token"]
    return other


async def test_an_attacker_on_the_same_address_cannot_lock_the_owner_out(tmp_path) -> None:
    web = await start_web(settings_for(tmp_path, webui_password="hunter2"))
    attacker = await _attacker(web)
    try:
        assert await _login(web, "hunter2") == 200  # the owner's browser, known from now on
        assert any(c.key == DEVICE_COOKIE_NAME for c in web.http.cookie_jar)
        await web.post("/api/logout", {})
        web.csrf = (await (await web.get("/api/bootstrap")).json())["csrf_token"]
        statuses = [await _login(attacker, f"guess{i}") for i in range(12)]
        assert statuses.count(401) == 5 and statuses.count(429) == 7, statuses
        assert await _login(attacker, "hunter2") == 429  # the attacker stays limited
        assert await _login(web, "hunter2") == 200  # the owner is not locked out
        # The owner's browser has a budget of its own: its own wrong guesses still count.
        statuses = [await _login(web, "nope") for _ in range(6)]
        assert statuses[-1] == 429
    finally:
        await attacker.http.close()
        await stop_web(web)


async def test_behind_a_trusted_proxy_each_client_has_its_own_limit(tmp_path) -> None:
    settings = settings_for(tmp_path, webui_password="hunter2", webui_trusted_proxies="127.0.0.1")
    web = await start_web(settings)
    try:
        evil = {"X-Forwarded-For": "203.0.113.5"}
        statuses = [await _login(web, "guess", **evil) for _ in range(8)]
        assert statuses[-1] == 429
        web.http.cookie_jar.clear()
        # Another client behind the same proxy, never logged in before: not locked out.
        assert await _login(web, "hunter2", **{"X-Forwarded-For": "198.51.100.7"}) == 200
        # A client prepending an address to the header does not escape its limit: the
        # proxy's own (rightmost) entry is the one believed.
        web.http.cookie_jar.clear()
        web.csrf = (await (await web.get("/api/bootstrap")).json())["csrf_token"]
        spoofed = {"X-Forwarded-For": "198.51.100.99, 203.0.113.5"}
        assert await _login(web, "hunter2", **spoofed) == 429
    finally:
        await stop_web(web)


async def test_without_a_trusted_proxy_x_forwarded_for_is_ignored(tmp_path) -> None:
    web = await start_web(settings_for(tmp_path, webui_password="hunter2"))
    try:
        statuses = [
            await _login(web, "guess", **{"X-Forwarded-For": f"198.51.100.{i}"}) for i in range(8)
        ]
        assert statuses.count(401) == 5 and statuses[-1] == 429, statuses
    finally:
        await stop_web(web)
