"""The chat-completions request body, checked: model, messages (each with a role and
content: text, or parts of text and ``image_url``), stream options and the generation
parameters (``chat_params``). Reading it off the wire is ``gateway.http.request_body``.

A conversation that ends with ``role: "tool"`` messages after an assistant message with
``tool_calls`` carries the client's results for calls of its own tools (``tool_outputs``):
it resumes the session's parked turn (``gateway.turns.client_calls``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent.messages import ChatMessage
from agent.providers.base import ModelOptions
from agent.tools import ToolOutput
from gateway.http.middleware import ApiError
from gateway.openai.chat_params import model_options

__all__ = ["ChatBody", "parse_chat_body"]


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

    messages: list[ChatMessage]  # each an object with a string role and checked content
    model: str
    stream: bool
    include_usage: bool
    options: ModelOptions
    tool_outputs: tuple[ToolOutput, ...] | None = None


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
    for message in reversed(messages):
        if message["role"] == "user":
            break
    else:
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
        tool_outputs=_tool_outputs(messages),
    )


def _tool_outputs(messages: list[ChatMessage]) -> tuple[ToolOutput, ...] | None:
    """The trailing ``role: "tool"`` messages (the client's results), or None."""
    outputs: list[ToolOutput] = []
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.get("role") != "tool":
            break
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise ApiError(
                400,
                f"messages[{index}] (role 'tool') needs a 'tool_call_id'",
                param=f"messages[{index}].tool_call_id",
                code="invalid_message",
            )
        outputs.insert(0, ToolOutput(call_id, _text_of(message.get("content"))))
    return tuple(outputs) if outputs else None


def _text_of(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return content if isinstance(content, str) else ""
