"""Reading a JSON request body for the HTTP surfaces: its media type, its size and what JSON
allows but text cannot hold.

A body must be ``application/json`` (415), at most the configured size (413; a body only
somewhat over is read before the answer, so clients that write the whole request first see
the 413 rather than a reset connection), arrive within the body deadline (408: a client
that stalls mid-body holds nothing for long), and be valid JSON (400). JSON also allows what no
text can hold and Python chokes on: a lone UTF-16 surrogate escape, nesting deep enough to
exhaust the parser; each is a 400 here, before anything runs. What the body must hold is
its route's business (``gateway.openai.chat_body`` for chat completions).
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from aiohttp import web

from gateway.http.middleware import ApiError, require_json

__all__ = ["DRAIN_FACTOR", "parse_json_bytes", "read_body_bytes", "read_json_body"]

# A body only somewhat over the cap is read (and thrown away) before the 413, so that
# clients that write the whole request before reading the answer see the 413 rather than
# a reset connection. Anything bigger is refused without reading it.
DRAIN_FACTOR = 8

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _has_lone_surrogate(body: Any) -> bool:
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _too_large(max_body_bytes: int) -> ApiError:
    return ApiError(
        413,
        f"request body exceeds the limit of {max_body_bytes} bytes",
        code="request_too_large",
    )


async def read_json_body(
    request: web.Request, max_body_bytes: int, *, timeout: float | None = None
) -> Any:
    """The JSON body of ``request``: 415 unless it is JSON, 413 beyond ``max_body_bytes``,
    408 when it has not all arrived within ``timeout`` seconds, 400 for anything JSON
    allows but text cannot hold (see the module docstring)."""
    require_json(request)
    return parse_json_bytes(await read_body_bytes(request, max_body_bytes, timeout=timeout))


async def read_body_bytes(
    request: web.Request, max_body_bytes: int, *, timeout: float | None = None
) -> bytes:
    """The raw body of ``request`` (a signed one is verified over its exact bytes): 413
    beyond ``max_body_bytes``, 408 when it has not all arrived within ``timeout`` seconds."""
    length = request.content_length
    if length is not None and length > max_body_bytes * DRAIN_FACTOR:
        raise _too_large(max_body_bytes)
    content = request.content
    if content.is_eof():
        # Already all here (a small body comes with its head): taken as it lies, with no
        # deadline to arm and none of ``read()``'s chunk loop (the length check below
        # refuses what is over the cap, as ``read()``'s own limit would).
        raw = content.read_nowait()
        if len(raw) > max_body_bytes:
            raise _too_large(max_body_bytes)
        return raw
    try:
        if timeout is None:
            raw = await request.read()
        else:
            async with asyncio.timeout(timeout):
                raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise _too_large(max_body_bytes) from None
    except TimeoutError:
        raise ApiError(
            408,
            f"the request body did not arrive within {timeout:g} s",
            code="request_timeout",
            headers={"Connection": "close"},
        ) from None
    if len(raw) > max_body_bytes:
        raise _too_large(max_body_bytes)
    return raw


def parse_json_bytes(raw: bytes) -> Any:
    """A body's JSON (None when empty); 400 for invalid JSON, nesting too deep to parse
    and lone surrogate escapes."""
    try:
        body = json.loads(raw) if raw else None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}", code="invalid_json") from None
    except RecursionError:
        raise ApiError(400, "request body is nested too deeply", code="invalid_json") from None
    if _SURROGATE_ESCAPE.search(raw) and _has_lone_surrogate(body):
        # JSON allows "\ud800" alone; it is not text, and nothing downstream (SQLite,
        # the model provider, the wire) can encode it.
        raise ApiError(
            400,
            "request body contains a lone UTF-16 surrogate escape (e.g. \\ud800), "
            "which is not valid Unicode text",
            code="invalid_json",
        )
    return body
