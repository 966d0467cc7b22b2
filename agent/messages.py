"""The chat vocabulary every room speaks: messages, tool calls and tool schemas, typed.

These are the OpenAI chat-completions shapes the agent loop sends to a provider and keeps in
a conversation, written as ``TypedDict``s so that a message list is checked where it is
built and read, yet stays the plain JSON object a provider, the store and the wire expect.
Only the keys Reveille reads or writes are named; a provider may add others (``total=False``).
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypeAlias, TypedDict

# A JSON document as ``json.loads`` returns it. Readers narrow with isinstance.
JSONValue: TypeAlias = "str | int | float | bool | list[JSONValue] | dict[str, JSONValue] | None"
JSONObject: TypeAlias = "dict[str, JSONValue]"

Role = Literal["system", "user", "assistant", "tool", "developer"]


class FunctionCall(TypedDict):
    """The function half of a tool call: its name and its arguments as a JSON string."""

    name: str
    arguments: str


class ToolCall(TypedDict):
    """One tool call in the exact OpenAI shape (``agent.loop`` normalises a provider's)."""

    id: str
    type: Literal["function"]
    function: FunctionCall


class ImageURL(TypedDict):
    url: str
    detail: NotRequired[str]


class ContentPart(TypedDict, total=False):
    """One part of a multi-part message: ``{"type": "text", "text": ...}`` or an image."""

    type: str
    text: str
    image_url: ImageURL


class ChatMessage(TypedDict, total=False):
    """One message of a conversation, as a chat-completions provider reads it."""

    role: Role
    content: str | list[ContentPart] | None
    name: str
    tool_calls: list[ToolCall]
    tool_call_id: str


class FunctionSchema(TypedDict, total=False):
    name: str
    description: str
    parameters: JSONObject


class ToolSchema(TypedDict):
    """A tool as offered to the model: ``{"type": "function", "function": {...}}``."""

    type: Literal["function"]
    function: FunctionSchema


class Usage(TypedDict):
    """Token counts of one model call or one turn (chat-completions names)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


def text_of(message: ChatMessage) -> str:
    """The message's text: its string content, or its text parts joined."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if not content:
        return ""
    return "".join(part.get("text", "") for part in content if part.get("type") == "text")
