"""The OpenAI chat-completions wire format: completion and chunk objects, SSE framing."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from agent.messages import JSONObject
from delivery.ids import new_token

__all__ = ["chunker", "completion_object", "completion_text", "send_sse"]


def completion_object(result: Any, model: str) -> JSONObject:
    """The ``chat.completion`` object of an agent result (``content`` and ``usage``; with
    ``pending_calls``, client tool calls: ``tool_calls`` and ``finish_reason: "tool_calls"``)."""
    usage = dict(getattr(result, "usage", None) or {})
    message: JSONObject = {"role": "assistant", "content": str(result.content or "")}
    pending = getattr(result, "pending_calls", None)
    if pending:
        message = {"role": "assistant", "content": message["content"] or None}
        message["tool_calls"] = [dict(call) for call in pending]
    return {
        "id": "chatcmpl-" + new_token()[:24],
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if pending else "stop",
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": int(usage.get("prompt_tokens", 0) or 0),
            "completion_tokens": int(usage.get("completion_tokens", 0) or 0),
            "total_tokens": int(usage.get("total_tokens", 0) or 0),
        },
    }


def completion_text(completion: Mapping[str, object]) -> str:
    choices = completion.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return ""
    message = choices[0].get("message")
    if not isinstance(message, dict):
        return ""
    return str(message.get("content") or "")


def chunker(completion: JSONObject) -> Callable[..., JSONObject]:
    def chunk(delta: JSONObject, finish_reason: str | None = None) -> JSONObject:
        return {
            "id": completion.get("id"),
            "object": "chat.completion.chunk",
            "created": completion.get("created"),
            "model": completion.get("model"),
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        }

    return chunk


async def send_sse(
    response: web.StreamResponse, payload: Mapping[str, object], *, event: str | None = None
) -> None:
    """One SSE message; ``event`` names it (plain OpenAI clients read unnamed ones)."""
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    try:
        encoded = data.encode()
    except UnicodeEncodeError:
        # A lone surrogate from a provider: escaped, it is still valid JSON (and UTF-8).
        encoded = json.dumps(payload, separators=(",", ":")).encode()
    prefix = f"event: {event}\n".encode() if event else b""
    await response.write(prefix + b"data: " + encoded + b"\n\n")
