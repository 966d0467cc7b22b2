"""The OpenAI chat-completions wire format: completion and chunk objects, SSE framing, and
the system message that carries delivered background results into a turn.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from aiohttp import web

from agent.markers import DELIVERY_MARKER

__all__ = ["chunker", "completion_text", "delivery_context_text", "send_sse"]


def completion_text(completion: dict[str, Any]) -> str:
    try:
        return str(completion["choices"][0]["message"]["content"] or "")
    except (KeyError, IndexError, TypeError):
        return ""


def delivery_context_text(contents: list[str]) -> str:
    """The system message that carries delivered background results into a turn."""
    return (
        f"{DELIVERY_MARKER} Background work started earlier in this conversation has "
        "finished; its results were delivered here while you were not running:\n\n"
        + "\n\n".join(c.rstrip() for c in contents)
    )


def chunker(completion: dict[str, Any]) -> Callable[..., dict[str, Any]]:
    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {
            "id": completion.get("id"),
            "object": "chat.completion.chunk",
            "created": completion.get("created"),
            "model": completion.get("model"),
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        }

    return chunk


async def send_sse(response: web.StreamResponse, payload: dict[str, Any]) -> None:
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    await response.write(f"data: {data}\n\n".encode())
