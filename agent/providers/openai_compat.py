"""A model provider for any OpenAI-compatible chat-completions endpoint.

Works with OpenAI, OpenRouter, vLLM, the llama.cpp server and Ollama through the official
`openai` client. Streaming assembles content and tool-call fragments into one `ModelReply`.
Every failure surfaces as a `ProviderError` whose text never contains the API key.

Per-call CPU is kept low, since every turn of the server pays it: one long-lived client per
event loop (closed by `aclose`), on the SDK's aiohttp transport when it is available (the
httpx pool scans every idle connection per request), and the request goes through the
client's public ``post`` with ``cast_to=object``: our messages and tool schemas are already
in wire format, so the SDK's per-call walk of its parameter types over them, and the
pydantic models built from every response and chunk, buy nothing here. The JSON is read
into a `ModelReply` directly.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import openai
from openai import AsyncOpenAI, AsyncStream

from agent import json_codec
from agent.messages import ChatMessage, ToolCall, ToolSchema
from agent.providers.base import (
    DeltaCallback,
    ModelOptions,
    ModelReply,
    ProviderError,
    empty_usage,
)

# The openai client refuses to start without a key; local servers (vLLM, llama.cpp, Ollama)
# accept any value, so a placeholder keeps those endpoints usable without configuration.
_NO_KEY_PLACEHOLDER = "sk-no-key-configured"
_MAX_ERROR_TEXT = 500
_log = logging.getLogger(__name__)
# An address inside an upstream's error text: API clients never see where the model is.
_ADDRESS = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+")
_PATH = "/chat/completions"
# The bearer key is sent as `chat.completions.create` sends it.
_OPTIONS: Any = {"security": {"bearer_auth": True}}


def _quiet_transport_logs() -> None:
    """The SDK's HTTP layer logs every request at INFO: one formatted line per model call.

    Unless the operator asked for debug logs or configured these loggers, only warnings
    and errors of theirs are kept.
    """
    if logging.getLogger().getEffectiveLevel() <= logging.DEBUG:
        return
    for name in ("httpx2", "httpx"):
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)


def _http_client(base_url: str | None, timeout: float) -> Any:
    """The SDK's aiohttp transport when its extra is installed, else None (the httpx default).

    aiohttp refuses a bearer header next to user:password in the url, so such an endpoint
    keeps the httpx transport.
    """
    parts = urlsplit(base_url or "")
    if parts.username is not None or parts.password is not None:
        return None
    try:
        return openai.DefaultAioHttpClient(timeout=timeout)
    except RuntimeError:
        return None


def _public_url(base_url: str | None) -> str:
    """The endpoint as it may appear in messages: without user:password in the netloc."""
    if not base_url:
        return "the default OpenAI endpoint"
    parts = urlsplit(base_url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _usage_dict(usage: Any) -> dict[str, int]:
    result = empty_usage()
    if not isinstance(usage, dict):
        return result
    for key in result:
        value = usage.get(key)
        result[key] = value if type(value) is int else int(value or 0)
    if not result["total_tokens"]:
        result["total_tokens"] = result["prompt_tokens"] + result["completion_tokens"]
    return result


class OpenAICompatProvider:
    """Chat completions against `base_url` with `model`, via `openai.AsyncOpenAI`."""

    def __init__(
        self,
        base_url: str | None,
        api_key: str | None,
        model: str,
        timeout: float = 120.0,
        *,
        max_retries: int = 2,
        stream_usage: bool = True,
    ) -> None:
        if not model:
            raise ValueError("OpenAICompatProvider needs a model name")
        self.name = model
        self.model = model
        self.base_url = base_url
        self.timeout = timeout
        self._api_key = api_key or None
        self._max_retries = max_retries
        # Asks for a final usage chunk when streaming; a server that rejects the option can
        # be served by turning this off.
        self._stream_usage = stream_usage
        # The HTTP connection pool of an async client belongs to the event loop that opened
        # it. Sub-agents run under asyncio.run on worker threads, so each loop gets its own
        # client instead of sharing connections across loops.
        self._clients: dict[asyncio.AbstractEventLoop, AsyncOpenAI] = {}
        self._clients_lock = threading.Lock()

    def __repr__(self) -> str:
        # Deliberately omits the key.
        return (
            f"OpenAICompatProvider(base_url={_public_url(self.base_url)!r}, model={self.model!r})"
        )

    def _client(self) -> AsyncOpenAI:
        loop = asyncio.get_running_loop()
        with self._clients_lock:
            for stale in [lp for lp in self._clients if lp.is_closed()]:
                del self._clients[stale]
            client = self._clients.get(loop)
            if client is None:
                _quiet_transport_logs()
                client = AsyncOpenAI(
                    base_url=self.base_url,
                    api_key=self._api_key or _NO_KEY_PLACEHOLDER,
                    timeout=self.timeout,
                    max_retries=self._max_retries,
                    http_client=_http_client(self.base_url, self.timeout),
                )
                self._clients[loop] = client
            return client

    async def aclose(self) -> None:
        """Close the HTTP client bound to the running event loop (call before that loop ends)."""
        loop = asyncio.get_running_loop()
        with self._clients_lock:
            client = self._clients.pop(loop, None)
        if client is not None:
            await client.close()

    async def complete(
        self,
        messages: list[ChatMessage],
        *,
        tools: list[ToolSchema] | None = None,
        on_delta: DeltaCallback | None = None,
        options: ModelOptions | None = None,
    ) -> ModelReply:
        """One call; every set field of ``options`` goes into the request as it is, except
        ``tool_choice`` and ``parallel_tool_calls`` on a call that offers no tools (the
        endpoint would refuse them there)."""
        # Written here and only sent on, never read back: object values are enough.
        request: dict[str, object] = {"model": self.model, "messages": messages}
        if tools:
            request["tools"] = tools
        if options:
            extra = options.as_request()
            if not tools:
                extra.pop("tool_choice", None)
                extra.pop("parallel_tool_calls", None)
            request.update(extra)
        if on_delta is None:
            return await self._complete_once(request)
        return await self._complete_streaming(request, on_delta)

    async def _complete_once(self, request: dict[str, object]) -> ModelReply:
        try:
            response: Any = await self._client().post(
                _PATH, cast_to=object, content=json_codec.dumps(request), options=_OPTIONS
            )
        except openai.OpenAIError as exc:
            raise self._provider_error(exc) from None
        if not isinstance(response, dict):
            # A body that is not JSON comes back as text.
            raise ProviderError(f"{self._label()} returned no choices")
        choices = response.get("choices")
        if not choices or not isinstance(choices, list) or not isinstance(choices[0], dict):
            raise ProviderError(f"{self._label()} returned no choices")
        choice = choices[0]
        message = choice.get("message")
        if not isinstance(message, dict):
            raise ProviderError(f"{self._label()} returned a choice without a message")
        tool_calls = [
            _finished_call(index, call)
            for index, call in enumerate(message.get("tool_calls") or [])
            if isinstance(call, dict)
        ]
        return ModelReply(
            content=message.get("content"),
            tool_calls=tool_calls,
            usage=_usage_dict(response.get("usage")),
            finish_reason=choice.get("finish_reason"),
        )

    async def _complete_streaming(
        self, request: dict[str, object], on_delta: DeltaCallback
    ) -> ModelReply:
        request["stream"] = True
        if self._stream_usage:
            request["stream_options"] = {"include_usage": True}
        content_parts: list[str] = []
        calls: dict[int, _CallDraft] = {}
        usage: Any = None
        finish_reason: str | None = None
        try:
            stream = await self._client().post(
                _PATH,
                cast_to=object,
                content=json_codec.dumps(request),
                options=_OPTIONS,
                stream=True,
                stream_cls=AsyncStream[object],
            )
            # The context manager releases the connection when we stop early (error, cancel).
            async with stream:
                async for chunk in stream:
                    if not isinstance(chunk, dict):
                        raise ValueError(f"a chunk is {type(chunk).__name__}, not an object")
                    if chunk.get("usage") is not None:
                        usage = chunk["usage"]
                    choices = chunk.get("choices")
                    if not choices:
                        continue
                    choice = choices[0]
                    if choice.get("finish_reason"):
                        finish_reason = choice["finish_reason"]
                    delta = choice.get("delta")
                    if not delta:
                        continue
                    for fragment in delta.get("tool_calls") or ():
                        _merge_tool_call_fragment(calls, fragment)
                    text = delta.get("content")
                    if text:
                        content_parts.append(text)
                        await _deliver(on_delta, text)
        except _ConsumerError as exc:
            # A consumer failure (say, the listening client went away) is not a provider
            # failure, so it keeps its own type.
            raise exc.original from None
        except openai.OpenAIError as exc:
            raise self._provider_error(exc) from None
        except (ValueError, TypeError, AttributeError, KeyError, IndexError) as exc:
            # A chunk that is not JSON, or JSON not shaped like a chunk: the endpoint does
            # not speak the streaming protocol.
            raise ProviderError(
                self._redact(f"{self._label()} sent malformed stream data: {exc}")[:_MAX_ERROR_TEXT]
            ) from None
        tool_calls = [_finish_tool_call(index, calls[index]) for index in sorted(calls)]
        return ModelReply(
            content="".join(content_parts) if content_parts else None,
            tool_calls=tool_calls,
            usage=_usage_dict(usage),
            finish_reason=finish_reason,
        )

    def _label(self) -> str:
        # No address: the message reaches API clients; the log line says where
        # (``_provider_error``).
        return f"the model provider (model {self.model})"

    def _redact(self, text: str) -> str:
        if self._api_key:
            text = text.replace(self._api_key, "***")
        return text

    def _provider_error(self, exc: openai.OpenAIError) -> ProviderError:
        """The error API clients may see (no address, no key); the operator's log has the
        upstream's address and the underlying cause (never the key)."""
        error = self._public_error(exc)
        cause = self._redact(str(exc.__cause__ or exc))[:_MAX_ERROR_TEXT]
        _log.warning("model call to %s failed: %s (%s)", _public_url(self.base_url), error, cause)
        return error

    def _public_error(self, exc: openai.OpenAIError) -> ProviderError:
        if isinstance(exc, openai.APIStatusError):
            detail = _ADDRESS.sub("<address>", _provider_message(exc))
            text = f"{self._label()} returned HTTP {exc.status_code}: {detail}"
            code = getattr(exc, "code", None)
            return ProviderError(
                self._redact(text)[:_MAX_ERROR_TEXT],
                status_code=exc.status_code,
                code=code if isinstance(code, str) else None,
            )
        if isinstance(exc, openai.APITimeoutError):
            # The SDK reports a refused connection as a timeout through its aiohttp transport
            # (the connect failure arrives as the HTTP library's ConnectTimeout): say what
            # happened. Matched by name: the SDK's HTTP package has been httpx and httpx2.
            if _is_connect_failure(exc.__cause__):
                return ProviderError(f"{self._label()} could not be reached")
            return ProviderError(f"{self._label()} timed out after {self.timeout:g} s")
        if isinstance(exc, openai.APIConnectionError):
            # The cause names the host: the log has it.
            return ProviderError(f"{self._label()} could not be reached")
        if isinstance(exc, openai.APIError):
            # Errors reported inside a stream carry a message but no status code.
            text = f"{self._label()} reported an error: {_ADDRESS.sub('<address>', exc.message)}"
            code = getattr(exc, "code", None)
            return ProviderError(
                self._redact(text)[:_MAX_ERROR_TEXT], code=code if isinstance(code, str) else None
            )
        text = f"{self._label()} failed: {type(exc).__name__}"
        return ProviderError(self._redact(text)[:_MAX_ERROR_TEXT])


def _is_connect_failure(exc: BaseException | None) -> bool:
    return exc is not None and any(
        cls.__name__ in ("ConnectTimeout", "ConnectError") for cls in type(exc).__mro__
    )


class _ConsumerError(Exception):
    """Carries an exception raised by on_delta past the provider-error translation."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(str(original))
        self.original = original


async def _deliver(on_delta: DeltaCallback, text: str) -> None:
    try:
        await on_delta(text)
    except Exception as exc:
        raise _ConsumerError(exc) from exc


def _provider_message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        message = body.get("message") or body.get("error") or body.get("detail")
        if isinstance(message, dict):
            message = message.get("message")
        if message:
            return str(message)
    if isinstance(body, str) and body.strip():
        return body.strip()
    return exc.message


def _finished_call(index: int, call: Mapping[str, object]) -> ToolCall:
    function = call.get("function")
    if not isinstance(function, Mapping):
        function = {}
    call_id = call.get("id")
    name = function.get("name")
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        # Arguments sent as an object rather than a JSON string: written out as one.
        arguments = json.dumps(arguments) if arguments else ""
    return {
        "id": call_id if isinstance(call_id, str) and call_id else f"call_{index}",
        "type": "function",
        "function": {"name": name if isinstance(name, str) else "", "arguments": arguments or "{}"},
    }


@dataclass
class _CallDraft:
    """A streamed tool call being put together from its fragments."""

    id: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)


def _merge_tool_call_fragment(calls: dict[int, _CallDraft], fragment: Mapping[str, Any]) -> None:
    # Tool calls stream as fragments keyed by index: the id and name usually arrive once,
    # the JSON arguments arrive in pieces that must be concatenated in order. A fragment is
    # unchecked JSON (Any): a malformed one raises, and the caller reports the stream as
    # malformed.
    index = fragment.get("index")
    if index is None:
        index = max(calls, default=-1) + 1
    entry = calls.setdefault(index, _CallDraft())
    if fragment.get("id") and not entry.id:
        entry.id = fragment["id"]
    function = fragment.get("function")
    if function:
        if function.get("name") and not entry.name:
            entry.name = function["name"]
        if function.get("arguments"):
            entry.arguments.append(function["arguments"])


def _finish_tool_call(index: int, entry: _CallDraft) -> ToolCall:
    return {
        "id": entry.id or f"call_{index}",
        "type": "function",
        "function": {"name": entry.name, "arguments": "".join(entry.arguments) or "{}"},
    }
