"""Reading a request body for the API server: its media type, its size and what JSON allows
but text cannot hold.

A body must be ``application/json`` (415), at most the configured size (413; a body only
somewhat over is read before the answer, so clients that write the whole request first see
the 413 rather than a reset connection), arrive within the body deadline (408: a client
that stalls mid-body holds nothing for long), and be valid JSON (400). JSON also allows what no
text can hold and Python chokes on: a lone UTF-16 surrogate escape, nesting deep enough to
exhaust the parser; each is a 400 here, before anything runs. ``parse_chat_body`` checks a
chat-completions body: model, messages (each with a role and content: text, or parts of
text and ``image_url``), stream options and the generation parameters (``chat_params``).
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from agent.providers.base import ModelOptions
from gateway.platforms.chat_params import model_options
from gateway.platforms.http_middleware import ApiError, require_json

__all__ = ["DRAIN_FACTOR", "ChatBody", "parse_chat_body", "read_json_body"]

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


def _part_ok(part: Any) -> bool:
    if not isinstance(part, dict):
        return False
    kind = part.get("type", "text")
    if kind == "text":
        return isinstance(part.get("text"), str)
    if kind == "image_url":
        image = part.get("image_url")
        return isinstance(image, dict) and isinstance(image.get("url"), str)
    return False


def _content_ok(content: Any) -> bool:
    if content is None or isinstance(content, str):
        return True
    return isinstance(content, list) and all(_part_ok(part) for part in content)


@dataclass(frozen=True)
class ChatBody:
    """A checked chat-completions request: what the turn needs and how to answer it."""

    messages: list[dict[str, Any]]
    model: str
    stream: bool
    include_usage: bool
    options: ModelOptions


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
    length = request.content_length
    if length is not None and length > max_body_bytes * DRAIN_FACTOR:
        raise _too_large(max_body_bytes)
    try:
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


def parse_chat_body(body: Any) -> ChatBody:
    """A chat-completions body, checked; 400 for anything malformed or unsupported."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise ApiError(
            400,
            "'model' is required (a non-empty string)",
            param="model",
            code="missing_required_parameter",
        )
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(
            400,
            "'messages' is required (a non-empty array)",
            param="messages",
            code="missing_required_parameter",
        )
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ApiError(
                400,
                f"messages[{index}] must be an object with a 'role'",
                param=f"messages[{index}]",
                code="invalid_message",
            )
        if not _content_ok(message.get("content")):
            raise ApiError(
                400,
                f"messages[{index}].content must be a string, null, or an array of "
                "parts like {'type': 'text', 'text': '...'} or "
                "{'type': 'image_url', 'image_url': {'url': '...'}}",
                param=f"messages[{index}].content",
                code="invalid_message",
            )
    last_user = next((m for m in reversed(messages) if m["role"] == "user"), None)
    if last_user is None:
        raise ApiError(
            400,
            "'messages' must contain a user message",
            param="messages",
            code="invalid_message",
        )
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise ApiError(400, "'stream' must be a boolean", param="stream", code="invalid_type")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(
            400,
            "'stream_options' must be an object",
            param="stream_options",
            code="invalid_type",
        )
    include_usage = options.get("include_usage", False)
    if include_usage is not None and not isinstance(include_usage, bool):
        raise ApiError(
            400,
            "'stream_options.include_usage' must be a boolean",
            param="stream_options",
            code="invalid_type",
        )
    return ChatBody(
        messages=messages,
        model=model,
        stream=bool(stream),
        include_usage=bool(include_usage),
        options=model_options(body),
    )
