"""The OpenAI Responses API's Response object and its stream events.

``body_of`` builds the Response object of a stored response at each step, every field
present (a model cut short ends ``incomplete`` with its reason; a failed or cancelled
response keeps its partial message, ``incomplete``); the ``*_events``
helpers build the streamed events (``response.created`` ... ``response.completed``) as
``(type, data)`` pairs whose data has no ``sequence_number``: the stream adds the stored
event's number (``sse_event``). The request these echo is ``gateway.openai.responses_wire``'s.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from agent.messages import JSONObject, JSONValue
from gateway.openai.responses_calls import function_call_events
from gateway.openai.responses_wire import ResponsesRequest

__all__ = [
    "INCOMPLETE_REASONS",
    "Event",
    "Output",
    "body_of",
    "event_json",
    "events_of_final",
    "output_events",
    "output_text",
    "partial_output",
    "sse_event",
    "terminal_event",
    "usage_object",
]


@dataclass(frozen=True)
class Output:
    """What the response produced so far: its message id, text and usage. ``cut``: the
    message ended before the model finished it (a length cut, a failure, a cancel), so
    its item is ``incomplete``."""

    message_id: str
    text: str = ""
    done: bool = False
    usage: Mapping[str, object] | None = None
    cut: bool = False


# Why a model stopped (chat's ``finish_reason``) -> the Response's ``incomplete_details``.
INCOMPLETE_REASONS = {"length": "max_output_tokens", "content_filter": "content_filter"}


def _item_status(out: Output) -> str:
    if out.cut:
        return "incomplete"
    return "completed" if out.done else "in_progress"


def _message(out: Output) -> JSONObject:
    content: list[JSONValue] = [
        {"type": "output_text", "text": out.text, "annotations": [], "logprobs": []}
    ]
    return {
        "id": out.message_id,
        "type": "message",
        "role": "assistant",
        "status": _item_status(out),
        "content": content if out.done or out.text else [],
    }


def _count(usage: Mapping[str, object], name: str, details: str | None = None) -> int:
    """A token count of a chat ``usage``, top-level or in its ``details`` object."""
    value = usage.get(name)
    if details is not None:
        inner = usage.get(details)
        value = inner.get(name) if isinstance(inner, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def usage_object(usage: Mapping[str, object] | None) -> JSONObject | None:
    """A chat ``usage`` as the Responses ``usage`` object, in the shape the openai
    package's ``ResponseUsage`` requires."""
    if usage is None:
        return None
    prompt = _count(usage, "prompt_tokens")
    completion = _count(usage, "completion_tokens")
    return {
        "input_tokens": prompt,
        "input_tokens_details": {
            "cached_tokens": _count(usage, "cached_tokens", "prompt_tokens_details"),
            "cache_write_tokens": 0,
        },
        "output_tokens": completion,
        "output_tokens_details": {
            "reasoning_tokens": _count(usage, "reasoning_tokens", "completion_tokens_details")
        },
        "total_tokens": _count(usage, "total_tokens") or prompt + completion,
    }


def _echo(request: ResponsesRequest) -> JSONObject:
    """The request's parameters as the Response repeats them (defaults where not asked)."""
    return {
        "temperature": 1.0 if request.temperature is None else request.temperature,
        "top_p": 1.0 if request.top_p is None else request.top_p,
        "presence_penalty": request.presence_penalty,
        "frequency_penalty": request.frequency_penalty,
        "top_logprobs": request.top_logprobs,
        "reasoning": request.reasoning,
        "max_output_tokens": request.max_output_tokens,
        "max_tool_calls": request.max_tool_calls,
        "parallel_tool_calls": request.parallel_tool_calls,
        "tool_choice": request.tool_choice,
        "tools": list(request.tools),
        "text": request.text,
        "truncation": request.truncation,
        "service_tier": request.service_tier,
        "safety_identifier": request.safety_identifier,
        "prompt_cache_key": request.prompt_cache_key,
        "prompt": request.prompt,
        "user": request.user,
        "store": request.store,
        "background": request.background,
        "instructions": request.instructions,
        "previous_response_id": request.previous_response_id,
        "metadata": {key: value for key, value in request.metadata.items()},
        "conversation": {"id": request.conversation} if request.conversation else None,
    }


def body_of(
    response_id: str,
    request: ResponsesRequest,
    *,
    status: str,
    created_at: float,
    output: Output | None = None,
    error: str | None = None,
    completed_at: float | None = None,
    incomplete: str | None = None,
) -> JSONObject:
    """The Response object of a response in ``status``; ``incomplete`` is the reason of an
    ``incomplete`` one (``max_output_tokens``, ``content_filter``)."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(created_at),
        "status": status,
        "completed_at": int(completed_at) if completed_at is not None else None,
        "error": {"code": "server_error", "message": error} if error else None,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "model": request.model,
        "output": [_message(output)] if output is not None and (output.text or output.done) else [],
        "usage": usage_object(output.usage if output else None),
        **_echo(request),
    }


def output_text(body: Mapping[str, object]) -> str:
    for item in _objects(body.get("output")):
        for part in _objects(item.get("content")):
            if part.get("type") == "output_text":
                return str(part.get("text") or "")
    return ""


def _objects(value: object) -> list[JSONObject]:
    """The objects of a JSON array (nothing for anything else)."""
    if not isinstance(value, list):
        return []
    return [item for item in value if isinstance(item, dict)]


Event = tuple[str, JSONObject]


def _item_ref(message_id: str) -> JSONObject:
    return {"item_id": message_id, "output_index": 0, "content_index": 0}


def output_events(out: Output, *, start: bool = False, delta: str | None = None) -> list[Event]:
    """The events of the message: its opening (``start``), one text ``delta``, or (with
    ``out.done``) its closing."""
    events: list[Event] = []
    if start:
        events.append(
            (
                "response.output_item.added",
                {"output_index": 0, "item": _message(Output(out.message_id))},
            )
        )
        part: JSONObject = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        events.append(("response.content_part.added", {**_item_ref(out.message_id), "part": part}))
    if delta:
        events.append(
            (
                "response.output_text.delta",
                {**_item_ref(out.message_id), "delta": delta, "logprobs": []},
            )
        )
    if out.done:
        ref = _item_ref(out.message_id)
        part = {"type": "output_text", "text": out.text, "annotations": [], "logprobs": []}
        events.append(("response.output_text.done", {**ref, "text": out.text, "logprobs": []}))
        events.append(("response.content_part.done", {**ref, "part": part}))
        events.append(("response.output_item.done", {"output_index": 0, "item": _message(out)}))
    return events


def terminal_event(body: JSONObject) -> Event:
    kind = {"completed": "response.completed", "incomplete": "response.incomplete"}.get(
        str(body["status"]), "response.failed"
    )
    return kind, {"response": body}


def events_of_final(body: JSONObject) -> list[Event]:
    """The whole stream of a finished response, rebuilt from its final object (a repeated
    idempotency key asked as a stream)."""
    opening: JSONObject = {
        **body,
        "status": "in_progress",
        "output": [],
        "usage": None,
        "completed_at": None,
        "error": None,
        "incomplete_details": None,
    }
    events: list[Event] = [
        ("response.created", {"response": opening}),
        ("response.in_progress", {"response": opening}),
    ]
    text = output_text(body)
    items = _objects(body.get("output"))
    messages = [item for item in items if item.get("type") == "message"]
    if messages:
        # As the live stream went: a message the model ended (completed, or cut by a
        # limit) is closed; one a failure stopped is left open, its deltas sent.
        closed = body.get("status") in ("completed", "incomplete")
        cut = messages[0].get("status") == "incomplete"
        out = Output(str(messages[0].get("id")), text, done=closed, cut=cut)
        events += output_events(out, start=True, delta=text)
    calls = [item for item in items if item.get("type") == "function_call"]
    events += function_call_events(calls, len(messages))
    events.append(terminal_event(body))
    return events


def partial_output(events: Iterable[tuple[str, Mapping[str, object]]]) -> Output | None:
    """What a stored event stream had produced: the message it opened and the text of
    its deltas, as an ``incomplete`` item (a cancelled response keeps what it streamed)."""
    message_id: str | None = None
    pieces: list[str] = []
    for type_, data in events:
        if type_ == "response.output_item.added" and message_id is None:
            item = data.get("item")
            if isinstance(item, dict) and isinstance(item.get("id"), str):
                message_id = item["id"]
        elif type_ == "response.output_text.delta" and isinstance(data.get("delta"), str):
            pieces.append(str(data["delta"]))
    if message_id is None:
        return None
    return Output(message_id, "".join(pieces), cut=True)


def event_json(type_: str, data: Mapping[str, object] | str, seq: int) -> str:
    """One event as the JSON text a client reads, with its ``type`` and ``sequence_number``
    (an SSE ``data`` line, a WebSocket text frame)."""
    payload = json.loads(data) if isinstance(data, str) else dict(data)
    payload = {"type": type_, **payload, "sequence_number": seq}
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"))


def sse_event(type_: str, data: Mapping[str, object] | str, seq: int) -> bytes:
    """One event in SSE framing, with its ``sequence_number``."""
    return f"event: {type_}\ndata: {event_json(type_, data, seq)}\n\n".encode()
