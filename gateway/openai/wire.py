"""The OpenAI chat-completions wire format: completion and chunk objects, SSE framing."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from agent import json_codec
from agent.messages import JSONObject
from delivery.ids import new_token

__all__ = [
    "chat_usage",
    "chunker",
    "completion_object",
    "completion_text",
    "finish_reason_of",
    "send_sse",
]


def completion_object(result: Any, model: str) -> JSONObject:
    """The ``chat.completion`` object of an agent result (``content`` and ``usage``; with
    ``pending_calls``, client tool calls: ``tool_calls`` and ``finish_reason: "tool_calls"``)."""
    usage = dict(getattr(result, "usage", None) or {})
    finish_reason = getattr(result, "finish_reason", None) or "stop"
    message: JSONObject = {"role": "assistant", "content": str(result.content or "")}
    pending = getattr(result, "pending_calls", None)
    if pending:
        message = {"role": "assistant", "content": message["content"] or None}
        message["tool_calls"] = [dict(call) for call in pending]
        finish_reason = "tool_calls"
    return {
        "id": "chatcmpl-" + new_token()[:24],
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish_reason,
                "logprobs": None,
            }
        ],
        "usage": chat_usage(usage),
    }


_USAGE_COUNTS = (
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "cached_tokens",
    "reasoning_tokens",
)


def chat_usage(usage: Mapping[str, object]) -> JSONObject:
    """``usage`` as the openai package's ``CompletionUsage`` has it, with its details."""

    # Read in one loop (every answer has a usage): a helper per count was a call each.
    counts: dict[str, int] = {}
    for name in _USAGE_COUNTS:
        value = usage.get(name)
        counts[name] = value if isinstance(value, int) and not isinstance(value, bool) else 0
    return {
        "prompt_tokens": counts["prompt_tokens"],
        "completion_tokens": counts["completion_tokens"],
        "total_tokens": counts["total_tokens"],
        "prompt_tokens_details": {"cached_tokens": counts["cached_tokens"], "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": counts["reasoning_tokens"],
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def finish_reason_of(completion: Mapping[str, object]) -> str:
    """The ``finish_reason`` of a stored completion's first choice (``stop`` if none)."""
    choices = completion.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        reason = choices[0].get("finish_reason")
        if isinstance(reason, str) and reason:
            return reason
    return "stop"


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


def json_answer(payload: object, headers: Mapping[str, str] | None = None) -> web.Response:
    """A JSON answer written by ``agent.json_codec`` (compact UTF-8), as ``web.json_response``
    would answer it otherwise."""
    return web.json_response(body=json_codec.dumps(payload), headers=headers)


async def send_sse(
    response: web.StreamResponse, payload: Mapping[str, object], *, event: str | None = None
) -> None:
    """One SSE message; ``event`` names it (plain OpenAI clients read unnamed ones)."""
    try:
        encoded = json_codec.dumps(payload)
    except UnicodeEncodeError:
        # A lone surrogate from a provider: escaped, it is still valid JSON (and UTF-8).
        encoded = json.dumps(payload, separators=(",", ":")).encode()
    prefix = f"event: {event}\n".encode() if event else b""
    await response.write(prefix + b"data: " + encoded + b"\n\n")
