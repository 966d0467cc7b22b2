"""The OpenAI Responses API request: the checked ``POST /v1/responses`` body.

``parse_responses_body`` checks a ``POST /v1/responses`` body (400 in OpenAI's error shape
for anything malformed or unsupported) into a ``ResponsesRequest``: the input items (each
given an id, for ``input_items``), the chat messages the turn service runs (``instructions``
as the system message), and the generation options, checked by the chat endpoint's own
rules (``chat_params``: client-defined tools are refused the same way). A top-level
parameter the openai package does not know is a 400 ``unknown_parameter``
(``known_params``); the parameters the Response only echoes are ``response_params``'.
The request is stored as JSON on the response's row, so any server can run it. The
Response object and its events are ``gateway.openai.response_object``'s.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, TypedDict

from agent.messages import ChatMessage, ContentPart, JSONObject, JSONValue
from agent.providers.base import ModelOptions
from agent.tools import ToolOutput
from delivery.ids import new_token
from gateway.http.middleware import ApiError
from gateway.openai.chat_params import model_options
from gateway.openai.known_params import refuse_unknown, responses_params
from gateway.openai.response_params import echoed_params, refuse_unsupported
from gateway.openai.responses_calls import (
    CallInputItem,
    CallOutputInputItem,
    call_input_item,
    output_input_item,
    tool_output_of,
)

__all__ = [
    "ResponsesRequest",
    "StoredInputItem",
    "conversation_of",
    "fingerprint_of_body",
    "input_items",
    "metadata_of",
    "new_response_id",
    "parse_responses_body",
]

_RESPONSE_ID = re.compile(r"resp_[A-Za-z0-9]{1,120}")
_ROLES = ("user", "assistant", "system", "developer")
_DETAILS = ("auto", "low", "high", "original")
_VERBOSITIES = ("low", "medium", "high")
_MAX_METADATA = 16


def new_response_id() -> str:
    return "resp_" + new_token()[:32]


def is_response_id(value: str) -> bool:
    return _RESPONSE_ID.fullmatch(value) is not None


def _bad(param: str, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


class InputPart(TypedDict, total=False):
    """One content part of a stored input item: ``input_text``/``output_text`` with
    ``text``, or ``input_image`` with ``image_url`` and ``detail``."""

    type: str
    text: str
    image_url: str
    detail: JSONValue


class InputItem(TypedDict):
    """One input item as stored with its id and listed by ``input_items``."""

    id: str
    type: str
    role: str
    status: str
    content: list[InputPart]


# What ``input_items`` lists: messages, and the client's function call items and results.
StoredInputItem = InputItem | CallInputItem | CallOutputInputItem


@dataclass(frozen=True)
class ResponsesRequest:
    """A checked ``POST /v1/responses`` body, as stored on the response's row."""

    model: str
    input: list[StoredInputItem]  # the input items with ids, as ``input_items`` lists them
    messages: list[ChatMessage]  # what the turn service runs
    instructions: str | None = None
    stream: bool = False
    background: bool = False
    store: bool = True
    previous_response_id: str | None = None
    # The API conversation (a session, ``gateway.conversations``) the turn runs in.
    conversation: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    options: JSONObject = field(default_factory=dict)  # ModelOptions.as_request()
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    tool_choice: str | JSONObject = "auto"
    parallel_tool_calls: bool = True
    text: JSONObject = field(default_factory=lambda: {"format": {"type": "text"}})
    # Echoed as asked (``echoed_params``); see README's field list for what each does.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    top_logprobs: int = 0
    reasoning: JSONObject | None = None
    max_tool_calls: int | None = None
    service_tier: str = "default"
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    truncation: str = "disabled"
    prompt: JSONObject | None = None
    user: str | None = None
    # The owner key that created it on a keyless server (the API server's
    # ``auth.owner_of``): reading it, its input items, continuing it need that key again.
    # None: the server's key.
    owner: str | None = None
    # Client function tools as sent, whether the server's own are offered too, and the
    # client's results for a parked turn's calls (``gateway.openai.responses_calls``).
    tools: list[JSONObject] = field(default_factory=list)
    server_tools: bool = True
    tool_outputs: list[JSONObject] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> ResponsesRequest:
        return cls(**json.loads(text))

    def model_options(self) -> ModelOptions | None:
        if not self.options:
            return None
        # Checked by ``model_options`` when the request was parsed: the fields fit.
        stop = self.options.get("stop")
        values: Mapping[str, Any] = {
            **self.options,
            **({"stop": tuple(stop)} if isinstance(stop, list) else {}),
        }
        return ModelOptions(**values)


def _part(part: Any, where: str) -> tuple[InputPart, ContentPart]:
    """(the stored input part, the chat part) of one content part."""
    if not isinstance(part, dict):
        raise _bad(where, f"{where} must be an object", "invalid_type")
    kind = part.get("type")
    if kind in ("input_text", "output_text", "text"):
        text = part.get("text")
        if not isinstance(text, str):
            raise _bad(where, f"{where}.text must be a string", "invalid_type")
        return {"type": kind if kind != "text" else "input_text", "text": text}, {
            "type": "text",
            "text": text,
        }
    if kind == "input_image":
        url = part.get("image_url")
        if not isinstance(url, str) or not url:
            raise _bad(
                where,
                f"{where}.image_url must be a URL or data URL (file ids are not supported)",
                "unsupported_value",
            )
        detail = part.get("detail", "auto")
        if detail not in _DETAILS:
            raise _bad(f"{where}.detail", f"{where}.detail must be one of {', '.join(_DETAILS)}")
        stored: InputPart = {"type": "input_image", "image_url": url, "detail": detail}
        # The detail goes on to the model (chat's ``image_url.detail``).
        return stored, {"type": "image_url", "image_url": {"url": url, "detail": detail}}
    raise _bad(
        where,
        f"{where}: content of type {kind!r} is not supported; use input_text or input_image",
        "unsupported_value",
    )


def _item(item: Any, index: int) -> tuple[InputItem, ChatMessage]:
    """(the stored input item, the chat message) of one input item."""
    where = f"input[{index}]"
    if not isinstance(item, dict):
        raise _bad(where, f"{where} must be an object", "invalid_type")
    if item.get("type") == "compaction":
        return _compaction_item(item, where)
    if item.get("type", "message") != "message":
        raise _bad(
            where,
            f"{where}: items of type {item.get('type')!r} are not supported: this server runs "
            "its own tools; send messages",
            "unsupported_value",
        )
    role = item.get("role")
    if role not in _ROLES:
        raise _bad(where, f"{where}.role must be one of {', '.join(_ROLES)}")
    content = item.get("content")
    if isinstance(content, str):
        kind = "output_text" if role == "assistant" else "input_text"
        parts: list[InputPart] = [{"type": kind, "text": content}]
        chat_content: str | list[ContentPart] = content
    elif isinstance(content, list) and content:
        pairs = [_part(p, f"{where}.content[{i}]") for i, p in enumerate(content)]
        parts = [stored for stored, _ in pairs]
        chat_content = [chat for _, chat in pairs]
    else:
        raise _bad(
            f"{where}.content",
            f"{where}.content must be a string or a non-empty array of parts",
            "invalid_type",
        )
    stored: InputItem = {
        "id": "msg_" + new_token()[:32],
        "type": "message",
        "role": role,
        "status": "completed",
        "content": parts,
    }
    return stored, {"role": role, "content": chat_content}


def _compaction_item(item: Mapping[str, Any], where: str) -> tuple[InputItem, ChatMessage]:
    """A ``compaction`` item (``POST /v1/responses/compact`` made it): its content is the
    summary in plain text, given to the model as a system message. A client could send
    the same text as a system message, so taking it grants nothing more."""
    summary = item.get("encrypted_content")
    if not isinstance(summary, str) or not summary:
        raise _bad(
            f"{where}.encrypted_content",
            f"{where}: a compaction item needs its 'encrypted_content' (a non-empty string)",
            "invalid_type",
        )
    stored: InputItem = {
        "id": "msg_" + new_token()[:32],
        "type": "message",
        "role": "system",
        "status": "completed",
        "content": [{"type": "input_text", "text": summary}],
    }
    return stored, {"role": "system", "content": summary}


def conversation_of(value: object) -> str | None:
    """The conversation id of a ``conversation`` parameter (an id, or an object with
    one); whether it names a conversation the caller may use is the route's to say."""
    if value is None:
        return None
    conversation = value.get("id") if isinstance(value, dict) else value
    if not isinstance(conversation, str) or not 0 < len(conversation) <= 128:
        raise _bad(
            "conversation", "'conversation' must be a conversation id or an object with its 'id'"
        )
    return conversation


def input_items(raw: object, param: str = "input") -> list[tuple[InputItem, ChatMessage]]:
    """Input items (messages, compaction items) checked as a create's ``input`` is:
    (the stored item, the chat message) of each."""
    if not isinstance(raw, list):
        raise _bad(param, f"'{param}' must be an array of items", "invalid_type")
    return [_item(item, i) for i, item in enumerate(raw)]


def metadata_of(value: Any) -> dict[str, str]:
    """A ``metadata`` parameter: at most 16 strings (keys up to 64, values up to 512)."""
    if value is None:
        return {}
    if (
        not isinstance(value, dict)
        or len(value) > _MAX_METADATA
        or not all(
            isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
            for k, v in value.items()
        )
    ):
        raise _bad(
            "metadata",
            f"'metadata' must be an object of at most {_MAX_METADATA} string values "
            "(keys up to 64 characters, values up to 512)",
        )
    return dict(value)


def _flag(body: Mapping[str, object], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _bad(name, f"'{name}' must be a boolean", "invalid_type")
    return value


def _text_format(value: Any) -> tuple[JSONObject, JSONObject | None]:
    """The ``text`` setting as the Response echoes it, and the chat ``response_format``."""
    if value is None:
        return {"format": {"type": "text"}}, None
    fmt = value.get("format") if isinstance(value, dict) else None
    if fmt is None:
        return {"format": {"type": "text"}}, None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise _bad("text.format", "'text.format.type' must be text, json_object or json_schema")
    if fmt["type"] == "text":
        return {"format": fmt}, None
    if fmt["type"] == "json_object":
        return {"format": fmt}, {"type": "json_object"}
    if not isinstance(fmt.get("name"), str) or not isinstance(fmt.get("schema"), dict):
        raise _bad("text.format", "a json_schema format needs a 'name' and a 'schema' object")
    schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
    return {"format": fmt}, {"type": "json_schema", "json_schema": schema}


def _text_setting(value: Any) -> tuple[JSONObject, JSONObject | None]:
    """``_text_format``, with ``text.verbosity`` echoed (it is not passed to the model)."""
    echoed, response_format = _text_format(value)
    verbosity = value.get("verbosity") if isinstance(value, dict) else None
    if verbosity is not None:
        if verbosity not in _VERBOSITIES:
            raise _bad("text.verbosity", "'text.verbosity' must be low, medium or high")
        echoed = {**echoed, "verbosity": verbosity}
    return echoed, response_format


def parse_responses_body(body: Any) -> ResponsesRequest:
    """A ``POST /v1/responses`` body, checked (see the module docstring)."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    refuse_unknown(body, responses_params())
    refuse_unsupported(body)
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise _bad(
            "model", "'model' is required (a non-empty string)", "missing_required_parameter"
        )
    raw = body.get("input")
    if isinstance(raw, str):
        if not raw:
            raise _bad("input", "'input' must not be empty")
        raw = [{"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise _bad(
            "input",
            "'input' is required: a string or a non-empty array of messages",
            "missing_required_parameter",
        )
    outputs: list[ToolOutput] = []
    stored: list[StoredInputItem] = []
    messages: list[ChatMessage] = []
    for i, item in enumerate(raw):
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "function_call_output":
            outputs.append(tool_output_of(item, f"input[{i}]"))
            stored.append(output_input_item(item, outputs[-1]))
        elif kind == "function_call":
            # A client's own call echoed back: listed, never run (the park holds it).
            stored.append(call_input_item(item, f"input[{i}]"))
        else:
            stored_item, message = _item(item, i)
            stored.append(stored_item)
            messages.append(message)
    if not outputs and not any(m["role"] == "user" for m in messages):
        raise _bad("input", "'input' must contain a user message")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise _bad("instructions", "'instructions' must be a string", "invalid_type")
    if instructions:
        messages.insert(0, {"role": "system", "content": instructions})
    conversation = conversation_of(body.get("conversation"))
    previous = body.get("previous_response_id")
    if previous is not None and (not isinstance(previous, str) or not is_response_id(previous)):
        raise _bad(
            "previous_response_id", "'previous_response_id' must be a response id (resp_...)"
        )
    if previous is not None and conversation is not None:
        raise _bad("conversation", "give 'conversation' or 'previous_response_id', not both")
    background = _flag(body, "background", False)
    store = _flag(body, "store", True)
    if background and not store:
        raise _bad(
            "store", "a background response must be stored: leave out 'store' or set it true"
        )
    max_output = body.get("max_output_tokens")
    if max_output is not None and (
        isinstance(max_output, bool) or not isinstance(max_output, int) or max_output < 1
    ):
        raise _bad("max_output_tokens", "'max_output_tokens' must be an integer of at least 1")
    text, response_format = _text_setting(body.get("text"))
    # The chat endpoint's own checks, under the chat names (client tools: ``client_tools``).
    chat_like: JSONObject = {
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "max_completion_tokens": max_output,
        "tool_choice": body.get("tool_choice"),
        "parallel_tool_calls": body.get("parallel_tool_calls"),
        "response_format": response_format,
    }
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise _bad("tools", "'tools' must be an array", "invalid_type")
    options = model_options(chat_like)
    return ResponsesRequest(
        model=model,
        input=stored,
        messages=messages,
        instructions=instructions,
        stream=_flag(body, "stream", False),
        background=background,
        store=store,
        previous_response_id=previous,
        conversation=conversation,
        metadata=metadata_of(body.get("metadata")),
        options=options.as_request(),
        temperature=options.temperature,
        top_p=options.top_p,
        max_output_tokens=max_output,
        tool_choice=dict(choice)
        if isinstance(choice := options.tool_choice, Mapping)
        else (choice or "auto"),
        parallel_tool_calls=True
        if options.parallel_tool_calls is None
        else options.parallel_tool_calls,
        text=text,
        **asdict(echoed_params(body)),
        tools=[tool for tool in tools if isinstance(tool, dict)],
        tool_outputs=[{"call_id": o.call_id, "output": o.output} for o in outputs],
    )


def fingerprint_of_body(body: Any) -> str:
    """What makes two requests "the same request" for an idempotency key (not ``stream``:
    a repeat may be told as a stream or as one answer alike)."""
    bound = {k: v for k, v in body.items() if k != "stream"} if isinstance(body, dict) else body
    material = json.dumps(bound, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(material.encode()).hexdigest()[:32]
