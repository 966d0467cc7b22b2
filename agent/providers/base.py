"""The contract every model provider keeps: one chat-completions call in, one `ModelReply` out.

The agent loop only ever talks to this protocol, so the offline demo model and any
OpenAI-compatible endpoint are interchangeable.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

DeltaCallback = Callable[[str], Awaitable[None]]


def empty_usage() -> dict[str, int]:
    return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}


@dataclass
class ModelReply:
    """One model answer: text, tool calls in the OpenAI shape, or both."""

    content: str | None
    # Each: {"id": str, "type": "function", "function": {"name": str, "arguments": json str}}
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=empty_usage)
    finish_reason: str | None = None


class ProviderError(RuntimeError):
    """A model call failed. The message is safe to show and log: it never holds credentials."""

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


@runtime_checkable
class ModelProvider(Protocol):
    """Anything that can answer a chat-completions request.

    `name` is the model identifier recorded with delegations and shown to clients.
    When `on_delta` is given, content is handed to it piece by piece as it is produced;
    the returned `ModelReply.content` is still the whole text.
    """

    name: str

    async def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        on_delta: DeltaCallback | None = None,
    ) -> ModelReply: ...


def add_usage(total: dict[str, int], extra: dict[str, int] | None) -> dict[str, int]:
    """Sum token counts; providers that omit a field count as zero for it."""
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        total[key] = int(total.get(key, 0) or 0) + int((extra or {}).get(key, 0) or 0)
    return total
