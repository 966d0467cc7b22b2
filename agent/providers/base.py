"""The contract every model provider keeps: one chat-completions call in, one `ModelReply` out.

The agent loop only ever talks to this protocol, so the offline demo model and any
OpenAI-compatible endpoint are interchangeable.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Protocol, runtime_checkable

from agent.messages import ChatMessage, JSONObject, ToolCall, ToolSchema

DeltaCallback = Callable[[str], Awaitable[None]]


def empty_usage() -> dict[str, int]:
    return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}


@dataclass
class ModelReply:
    """One model answer: text, tool calls in the OpenAI shape, or both."""

    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=empty_usage)
    finish_reason: str | None = None


@dataclass(frozen=True)
class ModelOptions:
    """Per-request generation options a client asked for (the OpenAI names); None = unset.

    Validated where the request arrives (``gateway.openai.chat_params``); a provider
    passes every set field on as it is (``as_request``) or, when it cannot honour one, says
    so in its documentation (the demo model ignores them). ``tool_choice`` is about the
    server's own tools: ``"required"`` applies to the first model call of a turn only
    (after the tool ran, the model must be free to answer).
    """

    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stop: str | tuple[str, ...] | None = None
    seed: int | None = None
    response_format: Mapping[str, Any] | None = None
    tool_choice: str | Mapping[str, Any] | None = None
    parallel_tool_calls: bool | None = None

    def as_request(self) -> JSONObject:
        """The set fields, as chat-completions request fields (``stop`` as a list)."""
        request: JSONObject = {}
        for item in fields(self):
            value = getattr(self, item.name)
            if value is None:
                continue
            if isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, Mapping):
                value = dict(value)
            request[item.name] = value
        return request

    def __bool__(self) -> bool:
        # True when any field is set: asked of every turn's options, so one comparison
        # with the unset options (the generated ``__eq__``) instead of a generator step
        # per field, and none for ``UNSET_OPTIONS`` itself (what most bodies get).
        return self is not UNSET_OPTIONS and self != UNSET_OPTIONS


# Frozen: one instance serves every request that sets no option.
UNSET_OPTIONS = ModelOptions()


# How providers say a request was longer than the model's context window: OpenAI's error
# code, and the phrases other OpenAI-compatible servers (vLLM, llama.cpp, Ollama...) use.
_OVERFLOW_CODE = "context_length_exceeded"
_OVERFLOW_PHRASES = (
    "context_length_exceeded",
    "maximum context length",
    "context length exceeded",
    "context window",
    "exceeds the context",
    "too many tokens",
    "prompt is too long",
)


class ProviderError(RuntimeError):
    """A model call failed. The message is safe to show and log: it never holds credentials.

    ``code`` is the provider's error code when it sent one (OpenAI's ``error.code``).
    """

    def __init__(
        self, message: str, *, status_code: int | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.code = code

    @property
    def context_overflow(self) -> bool:
        """The request was longer than the model's context window ("context length
        exceeded"): compacting the conversation and trying once more may succeed."""
        if self.code == _OVERFLOW_CODE:
            return True
        if self.status_code not in (None, 400, 413):
            return False
        text = str(self).lower()
        return any(phrase in text for phrase in _OVERFLOW_PHRASES)


@runtime_checkable
class ModelProvider(Protocol):
    """Anything that can answer a chat-completions request.

    `name` is the model identifier recorded with delegations and shown to clients.
    When `on_delta` is given, content is handed to it piece by piece as it is produced;
    the returned `ModelReply.content` is still the whole text. `options` carries the
    client's generation options (`ModelOptions`); callers pass it only when one is set, so
    a provider without the keyword still serves requests that set none.
    """

    name: str

    async def complete(
        self,
        messages: list[ChatMessage],
        *,
        tools: list[ToolSchema] | None = None,
        on_delta: DeltaCallback | None = None,
        options: ModelOptions | None = None,
    ) -> ModelReply: ...


def add_usage(total: dict[str, int], extra: dict[str, int] | None) -> dict[str, int]:
    """Sum token counts; providers that omit a field count as zero for it."""
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        total[key] = int(total.get(key, 0) or 0) + int((extra or {}).get(key, 0) or 0)
    return total
