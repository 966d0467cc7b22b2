"""``POST /v1/hooks/{name}`` on a real loopback server, mounted as the API server mounts it
(public behind the API-key check, each hook verifying its own signature).

Every refusal is a clear 4xx in the OpenAI error shape and writes nothing: no event row, no
ledger row. A verified event is stored and routed before its 200; the same ``webhook-id``
again answers the same and writes nothing new. Secrets rotate with overlap: old and new
verify until the overlap ends, then only the new one.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

import storage
from delivery.inbound import HookRoute, Inbox
from delivery.inbound_backend import HookBackend
from delivery.ledger import Ledger
from delivery.rows import RowQuery
from gateway.http.middleware import error_middleware
from gateway.surfaces.api_server.auth import ApiKeyAuth
from gateway.surfaces.api_server.hooks import HOOKS_PREFIX, HookRoutes
from gateway.webhooks import new_secret, secret_key, sign
from tests.delivery._support import FakeClock

MAX_BODY = 8192


def sign_bytes(secret: str, msg_id: str, stamp: int, raw: bytes) -> str:
    """``gateway.webhooks.sign`` over bytes that need not be text (a sender's bad body)."""
    mac = hmac.new(secret_key(secret), f"{msg_id}.{stamp}.".encode() + raw, hashlib.sha256)
    return "v1," + base64.b64encode(mac.digest()).decode()


@dataclass
class Site:
    client: TestClient
    hooks: HookBackend
    ledger: Ledger
    clock: FakeClock
    secret: str

    async def post(
        self,
        body: bytes | str | object,
        *,
        hook: str = "ci",
        msg_id: str = "msg_1",
        secret: str | None = None,
        timestamp: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, Any]]:
        raw = (
            body
            if isinstance(body, bytes)
            else (body if isinstance(body, str) else json.dumps(body)).encode()
        )
        stamp = int(self.clock() if timestamp is None else timestamp)
        sent = {
            "Content-Type": "application/json",
            "webhook-id": msg_id,
            "webhook-timestamp": str(stamp),
            "webhook-signature": sign_bytes(secret or self.secret, msg_id, stamp, raw),
            **(headers or {}),
        }
        resp = await self.client.post(f"{HOOKS_PREFIX}{hook}", data=raw, headers=sent)
        return resp.status, await resp.json()

    def written(self) -> tuple[int, int]:
        """(stored events, ledger rows): what a refusal must leave at zero."""
        events = len(self.hooks.events_since("ci", 0, 1000))
        rows = len(self.ledger.query(RowQuery(limit=1000)))
        return events, rows


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    opened = storage.open_storage("memory://")
    clock = FakeClock(start=time.time())
    ledger = Ledger(opened.open_ledger(), clock=clock, monotonic=clock.monotonic)
    hooks = opened.open_hooks()
    secret = new_secret()
    hooks.rotate_secret("ci", secret, clock(), 86400)
    inbox = Inbox.of(hooks, [HookRoute("ci", session="sess_1"), HookRoute("bare")], 3600)
    auth = ApiKeyAuth("api-key")
    app = web.Application(middlewares=[error_middleware, auth.middleware])
    auth.public(HOOKS_PREFIX)
    HookRoutes(
        inbox,
        max_body_bytes=MAX_BODY,
        runtime=lambda: SimpleNamespace(ledger=ledger),  # type: ignore[arg-type,return-value]
        clock=clock,
    ).add_to(app.router)
    async with TestClient(TestServer(app)) as client:
        yield Site(client, hooks, ledger, clock, secret)
    ledger.backend.close()


async def test_a_verified_event_is_stored_and_routed_before_the_200_once(site: Site) -> None:
    status, body = await site.post({"build": 42, "status": "green"})
    assert status == 200, body
    assert body == {"object": "hook.event", "hook": "ci", "id": "msg_1", "duplicate": False}
    assert site.written() == (1, 1)
    status, body = await site.post({"build": 42, "status": "green"})  # the sender retries
    assert status == 200 and body["duplicate"] is True
    assert site.written() == (1, 1)  # nothing new: one event, one wake-up row
    [row] = site.ledger.query(RowQuery(limit=10))
    assert row.kind == "inbound" and row.origin_session_id == "sess_1"


async def test_a_bad_signature_is_401_and_writes_nothing(site: Site) -> None:
    status, body = await site.post({"build": 42}, secret=new_secret())
    assert status == 401 and body["error"]["code"] == "invalid_signature", body
    status, body = await site.post(
        {"build": 42}, headers={"webhook-signature": "v1,bm90IGEgc2lnbmF0dXJl"}
    )
    assert status == 401
    # A body changed after signing: the signature was over other bytes.
    stamp = int(site.clock())
    resp = await site.client.post(
        f"{HOOKS_PREFIX}ci",
        data=b'{"build": 43}',
        headers={
            "Content-Type": "application/json",
            "webhook-id": "m",
            "webhook-timestamp": str(stamp),
            "webhook-signature": sign(site.secret, "m", stamp, '{"build": 42}'),
        },
    )
    assert resp.status == 401
    assert site.written() == (0, 0)


async def test_stale_missing_oversized_unknown_and_non_json_are_refused_clearly(
    site: Site,
) -> None:
    status, body = await site.post({"a": 1}, timestamp=site.clock() - 301)
    assert status == 401 and body["error"]["code"] == "stale_timestamp"
    assert "300 s" in body["error"]["message"]
    status, body = await site.post({"a": 1}, timestamp=site.clock() + 400)  # from the future
    assert status == 401
    status, body = await site.post({"a": 1}, headers={"webhook-id": ""})
    assert status == 400 and "webhook-id" in body["error"]["message"]
    status, body = await site.post({"a": "x" * MAX_BODY})
    assert status == 413
    status, body = await site.post({"a": 1}, hook="nope")
    assert status == 404 and body["error"]["code"] == "hook_not_found"
    status, body = await site.post({"a": 1}, headers={"Content-Type": "text/plain"})
    assert status == 415
    status, body = await site.post({"a": 1}, hook="bare")  # declared, but no secret yet
    assert status == 401 and "reveille hooks secret bare" in body["error"]["message"]
    assert site.written() == (0, 0)


async def test_hostile_bodies_get_a_clear_4xx_or_are_stored_as_they_came(site: Site) -> None:
    assert (await site.post('{"s": "\\ud800"}', msg_id="surrogate"))[0] == 400
    deep = "[" * 3000 + "]" * 3000  # deeper than any parser here reads
    assert (await site.post(deep, msg_id="deep"))[0] == 400
    assert (await site.post('{"n": ' + "9" * 4400 + "}", msg_id="huge"))[0] == 400
    assert (await site.post(b'{"s": "\xff"}', msg_id="bytes"))[0] == 400
    assert site.written() == (0, 0)
    big = '{"n": ' + "9" * 1000 + "}"
    assert (await site.post(big, msg_id="big"))[0] == 200
    assert site.hooks.events_since("ci", 0, 10)[-1].body == big  # the exact bytes signed


async def test_rotation_overlap_accepts_old_and_new_then_only_new(site: Site) -> None:
    old = site.secret
    new = new_secret()
    site.hooks.rotate_secret("ci", new, site.clock(), 600)
    assert (await site.post({"n": 1}, msg_id="a", secret=old))[0] == 200
    assert (await site.post({"n": 2}, msg_id="b", secret=new))[0] == 200
    site.clock.advance(601)
    assert (await site.post({"n": 3}, msg_id="c", secret=old))[0] == 401
    assert (await site.post({"n": 4}, msg_id="d", secret=new))[0] == 200


async def test_the_api_key_still_guards_everything_else(site: Site) -> None:
    resp = await site.client.post("/v1/hooks/ci/../../chat/completions", data=b"{}")
    assert resp.status in (401, 404)
    resp = await site.client.post("/v1/hooks", data=b"{}")
    assert resp.status == 401
