"""``POST /v1/hooks/{name}``: inbound events, verified, stored and routed before the 2xx.

The route is public (no API key): each hook verifies the Standard Webhooks signature of its
own secrets (``gateway.hook_signature``; ``reveille hooks secret NAME``). In order, each
refusal writes nothing: an undeclared hook is 404 (before the body is read); a body that is
not JSON is 415, one over ``[hooks] max_body_bytes`` 413; missing or malformed signature
headers are 400; a hook without a secret, a timestamp more than 5 minutes off, or no
signature that verifies is 401; a verified body that is not valid JSON text (invalid
UTF-8, a lone surrogate escape, nesting or a number too big to read) is 400. A verified
event is stored and routed (``delivery.inbound.receive``) and only then answered 200,
``{"object": "hook.event", "hook", "id", "duplicate"}``; the same ``webhook-id`` posted again
is answered the same and writes nothing new.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from aiohttp import web

from delivery.inbound import Inbox, Receipt, receive
from delivery.inbound_backend import HookEvent
from gateway.hook_signature import SignatureError, verify
from gateway.http.middleware import ApiError, require_json
from gateway.http.request_body import parse_json_bytes, read_body_bytes
from tools.delegation_runtime import DelegationRuntime, get_runtime

__all__ = ["HOOKS_PREFIX", "HookRoutes"]

HOOKS_PREFIX = "/v1/hooks/"
log = logging.getLogger(__name__)


class HookRoutes:
    """The handler, over the inbox (store and declared hooks) and the runtime's ledger."""

    def __init__(
        self,
        inbox: Inbox,
        *,
        max_body_bytes: int,
        body_timeout: float | None = None,
        runtime: Callable[[], DelegationRuntime] = get_runtime,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.inbox = inbox
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout
        self._runtime = runtime
        self._clock = clock

    def add_to(self, router: web.UrlDispatcher) -> None:
        router.add_post(HOOKS_PREFIX + "{name}", self.receive)

    async def receive(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        route = self.inbox.routes.get(name)
        if route is None:
            raise ApiError(
                404, f"no hook named {name[:64]!r} on this server", code="hook_not_found"
            )
        require_json(request)
        raw = await read_body_bytes(request, self.max_body_bytes, timeout=self.body_timeout)
        now = self._clock()
        secrets = [s.secret for s in await asyncio.to_thread(self.inbox.store.secrets, name, now)]
        if not secrets:
            raise ApiError(
                401,
                f"hook {name!r} has no secret yet: run `reveille hooks secret {name}` on the "
                "server and sign with it",
                code="invalid_signature",
            )
        try:
            signed = verify(secrets, request.headers, raw, now)
        except SignatureError as exc:
            raise ApiError(exc.status, str(exc), code=exc.code) from None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ApiError(400, "the body is not UTF-8 text", code="invalid_json") from None
        parse_json_bytes(raw)  # refuses what JSON allows but text cannot hold
        event = HookEvent(name, signed.webhook_id, now, text)
        ledger = self._runtime().ledger
        receipt: Receipt = await asyncio.to_thread(receive, self.inbox.store, ledger, route, event)
        log.info(
            "inbound event %s on hook %s%s%s",
            signed.webhook_id,
            name,
            " (a re-post: nothing new)" if receipt.duplicate else "",
            f", fired {len(receipt.fired)} wait(s)" if receipt.fired else "",
        )
        return web.json_response(
            {
                "object": "hook.event",
                "hook": name,
                "id": signed.webhook_id,
                "duplicate": receipt.duplicate,
            }
        )
