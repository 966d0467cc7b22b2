"""The checks every OpenAI turn endpoint of the API server makes before it reads a turn
(``/v1/chat/completions`` and ``/v1/responses`` alike): 503 while the server drains, and an
``Idempotency-Key`` of 1 to 255 characters; and the keep-alive loop of their streams."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TypeVar

from aiohttp import web

from gateway.http.middleware import RETRY_AFTER_SECONDS, ApiError

__all__ = ["IDEMPOTENCY_HEADER", "idempotency_key", "refuse_while_draining", "with_keepalives"]

IDEMPOTENCY_HEADER = "Idempotency-Key"
_MAX_IDEMPOTENCY_KEY = 255

T = TypeVar("T")


def refuse_while_draining(draining: bool) -> None:
    """503 with ``Retry-After`` while the server drains: clients are sent to try again, on
    this server's successor or another one."""
    if draining:
        raise ApiError(
            503,
            "the server is restarting; send the request again in a moment",
            type_="server_error",
            code="draining",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )


def idempotency_key(request: web.Request) -> str | None:
    """The request's ``Idempotency-Key`` as sent (None without one); 400 when it is empty or
    longer than the records hold."""
    key = request.headers.get(IDEMPOTENCY_HEADER)
    if key is not None and not 0 < len(key) <= _MAX_IDEMPOTENCY_KEY:
        raise ApiError(
            400,
            f"{IDEMPOTENCY_HEADER} must be 1-{_MAX_IDEMPOTENCY_KEY} characters",
            param=IDEMPOTENCY_HEADER,
            code="invalid_idempotency_key",
        )
    return key


async def with_keepalives(
    queue: asyncio.Queue[T | None], response: web.StreamResponse, seconds: float
) -> AsyncIterator[T]:
    """The pieces of ``queue`` until its None, writing an SSE comment to ``response`` each
    ``seconds`` nothing comes, so proxies keep an idle stream open."""
    while True:
        try:
            piece = await asyncio.wait_for(queue.get(), seconds)
        except TimeoutError:
            await response.write(b": keep-alive\n\n")
            continue
        if piece is None:
            return
        yield piece
