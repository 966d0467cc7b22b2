"""Client tool calls on the Responses wire: the ``function_call`` output items a response
that stopped for the client's tools ends with, their stream events
(``response.output_item.added``, ``response.function_call_arguments.delta`` / ``.done``,
``response.output_item.done``), and the ``function_call_output`` input items that resume
it, stored (with the client's echoed ``function_call`` items) as
``GET /v1/responses/{id}/input_items`` lists them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from agent.messages import JSONObject
from agent.tools import ToolOutput
from delivery.ids import new_token
from gateway.http.middleware import ApiError

__all__ = [
    "CallInputItem",
    "CallOutputInputItem",
    "call_input_item",
    "calls_of",
    "function_call_events",
    "function_call_items",
    "output_input_item",
    "tool_output_of",
]

Event = tuple[str, JSONObject]
_MAX_ITEM_ID = 128


class CallInputItem(TypedDict):
    """A client's echoed ``function_call`` input item, as ``input_items`` lists it."""

    id: str
    type: str
    call_id: str
    name: str
    arguments: str
    status: str


class CallOutputInputItem(TypedDict):
    """A ``function_call_output`` input item, as ``input_items`` lists it."""

    id: str
    type: str
    call_id: str
    output: str
    status: str


def calls_of(completion: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The client tool calls of a turn's chat completion (none when it answered)."""
    choices = completion.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return []
    message = choices[0].get("message")
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    return [call for call in calls or [] if isinstance(call, dict)]


def function_call_items(calls: Sequence[Mapping[str, Any]]) -> list[JSONObject]:
    """One completed ``function_call`` item per call, in the client's names."""
    return [
        {
            "id": "fc_" + new_token()[:32],
            "type": "function_call",
            "call_id": str(call["id"]),
            "name": str(call["function"]["name"]),
            "arguments": str(call["function"]["arguments"]),
            "status": "completed",
        }
        for call in calls
    ]


def function_call_events(items: Sequence[JSONObject], first_index: int) -> list[Event]:
    """The stream events of ``items``, placed from ``first_index`` in the output."""
    events: list[Event] = []
    for offset, item in enumerate(items):
        index = first_index + offset
        ref: JSONObject = {"item_id": item["id"], "output_index": index}
        opening = {**item, "arguments": "", "status": "in_progress"}
        events.append(("response.output_item.added", {"output_index": index, "item": opening}))
        events.append(
            ("response.function_call_arguments.delta", {**ref, "delta": item["arguments"]})
        )
        events.append(
            ("response.function_call_arguments.done", {**ref, "arguments": item["arguments"]})
        )
        events.append(("response.output_item.done", {"output_index": index, "item": item}))
    return events


def tool_output_of(item: Mapping[str, Any], where: str) -> ToolOutput:
    """A ``function_call_output`` input item, checked."""
    call_id, output = item.get("call_id"), item.get("output")
    if not isinstance(call_id, str) or not call_id:
        raise ApiError(400, f"{where}.call_id must be a string", param=where)
    if isinstance(output, list):  # output parts: their text
        output = "".join(str(p.get("text", "")) for p in output if isinstance(p, dict))
    if not isinstance(output, str):
        raise ApiError(400, f"{where}.output must be a string", param=where)
    return ToolOutput(call_id, output)


def _item_id(item: Mapping[str, Any], prefix: str) -> str:
    """The client's own item id when it sent a sane one, else a new one."""
    given = item.get("id")
    if isinstance(given, str) and 0 < len(given) <= _MAX_ITEM_ID:
        return given
    return prefix + new_token()[:32]


def call_input_item(item: Mapping[str, Any], where: str) -> CallInputItem:
    """A client's echoed ``function_call`` input item, checked: it says nothing the server
    lacks (the park holds the calls), yet it is part of the input the client sent."""
    fields = {name: item.get(name) for name in ("call_id", "name", "arguments")}
    for name, value in fields.items():
        if not isinstance(value, str):
            raise ApiError(400, f"{where}.{name} must be a string", param=f"{where}.{name}")
    return {
        "id": _item_id(item, "fc_"),
        "type": "function_call",
        "call_id": str(fields["call_id"]),
        "name": str(fields["name"]),
        "arguments": str(fields["arguments"]),
        "status": "completed",
    }


def output_input_item(item: Mapping[str, Any], output: ToolOutput) -> CallOutputInputItem:
    """A checked ``function_call_output`` input item (``tool_output_of``) as stored."""
    return {
        "id": _item_id(item, "fco_"),
        "type": "function_call_output",
        "call_id": output.call_id,
        "output": output.output,
        "status": "completed",
    }
