"""Client-defined function tools on the OpenAI wire: ``tools``, ``tool_choice``,
``allowed_tools`` and the ``X-Reveille-Server-Tools`` switch, read into an
``agent.tools.ToolOffer``; and the pending calls a parked turn hands back, in the client's
names (chat ``tool_calls``, Responses ``function_call`` items).

Only ``function`` tools are taken. Anything else a client may send (``web_search``,
``file_search``, an ``mcp`` tool with a ``server_url``...) is a 400: this server never calls
a URL a client supplies. A client tool whose name a server tool has is offered to the model
as ``client__<name>`` and mapped back in everything the client sees.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.messages import JSONObject, ToolCall
from agent.tools import ClientTool, ToolOffer, client_model_name
from gateway.http.middleware import ApiError

__all__ = [
    "SERVER_TOOLS_HEADER",
    "ToolRequest",
    "client_calls",
    "read_tool_request",
    "server_tools_wanted",
]

SERVER_TOOLS_HEADER = "X-Reveille-Server-Tools"
_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
_CHOICES = ("none", "auto", "required")


@dataclass(frozen=True)
class ToolRequest:
    """What a request says about tools: the offer, and ``tool_choice`` as the model gets it
    (a named tool under its model name)."""

    offer: ToolOffer
    tool_choice: str | JSONObject | None


def _bad(param: str, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def server_tools_wanted(header: str | None) -> bool:
    """``X-Reveille-Server-Tools: off`` (or ``0``/``false``/``no``): only the client's tools."""
    if header is None:
        return True
    value = header.strip().lower()
    if value in ("on", "1", "true", "yes", ""):
        return True
    if value in ("off", "0", "false", "no"):
        return False
    raise _bad(SERVER_TOOLS_HEADER, f"{SERVER_TOOLS_HEADER} must be 'on' or 'off'")


def _function_of(tool: Mapping[str, Any], responses: bool) -> Mapping[str, Any]:
    # Chat nests the function ({"type": "function", "function": {...}}); Responses does not.
    if responses:
        return tool
    function = tool.get("function")
    if not isinstance(function, dict):
        raise _bad("tools", "a function tool needs a 'function' object with a 'name'")
    return function


def _client_tool(
    index: int, tool: object, responses: bool, server_names: Collection[str]
) -> ClientTool:
    param = "tools"
    where = f"tools[{index}]"
    if not isinstance(tool, dict):
        raise _bad(param, f"'{where}' must be an object", "invalid_type")
    kind = tool.get("type")
    if kind != "function":
        raise _bad(
            param,
            f"{where}: tools of type {kind!r} are not supported: only 'function' tools (which the "
            "client runs itself) are; this server never calls a URL or service a client names",
            "unsupported_value",
        )
    function = _function_of(tool, responses)
    name = function.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise _bad(param, f"'{where}' needs a 'name' of 1-64 letters, digits, '_', '-', '.'")
    parameters = function.get("parameters")
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    if not isinstance(parameters, dict):
        raise _bad(param, f"'{where}' parameters must be a JSON schema object", "invalid_type")
    description = function.get("description")
    strict = function.get("strict")
    return ClientTool(
        name=name,
        model_name=client_model_name(name, server_names),
        description=description if isinstance(description, str) else "",
        parameters=parameters,
        strict=strict if isinstance(strict, bool) else None,
    )


def _model_name(name: object, tools: Sequence[ClientTool], server_names: Collection[str]) -> str:
    if not isinstance(name, str):
        raise _bad("tool_choice", "a named 'tool_choice' needs a function 'name'")
    found = next((tool for tool in tools if tool.name == name), None)
    if found is not None:
        return found.model_name
    if name in server_names:
        return name
    raise _bad("tool_choice", f"'tool_choice' names {name!r}, which is not an offered tool")


def _named(choice: Mapping[str, Any], responses: bool) -> object:
    if responses or not isinstance(choice.get("function"), dict):
        return choice.get("name")
    return choice["function"].get("name")


def _allowed(
    choice: Mapping[str, Any], tools: Sequence[ClientTool], server_names: Collection[str]
) -> tuple[frozenset[str], str]:
    # Chat nests it ({"type": "allowed_tools", "allowed_tools": {...}}); Responses does not.
    inner = choice.get("allowed_tools")
    if isinstance(inner, dict):
        choice = inner
    listed = choice.get("tools")
    if not isinstance(listed, list):
        raise _bad("tool_choice", "'allowed_tools' needs a 'tools' array", "invalid_type")
    names = frozenset(_model_name(_listed_name(item), tools, server_names) for item in listed)
    mode = choice.get("mode", "auto")
    if mode not in ("auto", "required"):
        raise _bad("tool_choice", "'allowed_tools.mode' must be 'auto' or 'required'")
    return names, str(mode)


def _listed_name(item: object) -> object:
    if not isinstance(item, dict):
        return None
    function = item.get("function")
    return function.get("name") if isinstance(function, dict) else item.get("name")


def read_tool_request(
    body: Mapping[str, Any],
    server_names: Collection[str],
    *,
    server_tools: bool = True,
    responses: bool = False,
) -> ToolRequest:
    """The ``tools`` and ``tool_choice`` of a chat (or, with ``responses``, a Responses)
    body, checked; 400 for anything malformed or unsupported."""
    if "tools" not in body and "tool_choice" not in body and "functions" not in body:
        # Most requests: nothing to check, and the same answer each time (frozen).
        return _NO_TOOLS if server_tools else _NO_TOOLS_AT_ALL
    if body.get("functions"):
        raise _bad(
            "functions", "'functions' is deprecated: send 'tools' instead", "unsupported_parameter"
        )
    raw = body.get("tools")
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise _bad("tools", "'tools' must be an array", "invalid_type")
    taken = set(server_names) if server_tools else set()
    tools = [_client_tool(i, tool, responses, taken) for i, tool in enumerate(raw)]
    if len({tool.name for tool in tools}) != len(tools):
        raise _bad("tools", "two client tools have the same name")
    if len({tool.model_name for tool in tools}) != len(tools):
        # "x" renamed to "client__x" beside a tool of that very name: the model could not
        # tell them apart.
        raise _bad("tools", "a client tool's name collides with another's once namespaced")
    choice = body.get("tool_choice")
    allowed: frozenset[str] | None = None
    model_choice: str | JSONObject | None
    if choice is None or (isinstance(choice, str) and choice in _CHOICES):
        model_choice = choice
    elif isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        allowed, model_choice = _allowed(choice, tools, taken)
    elif isinstance(choice, dict) and choice.get("type") == "function":
        name = _model_name(_named(choice, responses), tools, taken)
        model_choice = {"type": "function", "function": {"name": name}}
    else:
        raise _bad(
            "tool_choice",
            "'tool_choice' must be 'none', 'auto', 'required', a function by name, or "
            "allowed_tools",
        )
    offer = ToolOffer(client=tuple(tools), server_tools=server_tools, allowed=allowed)
    return ToolRequest(offer, model_choice)


_NO_TOOLS = ToolRequest(ToolOffer(), None)
_NO_TOOLS_AT_ALL = ToolRequest(ToolOffer(server_tools=False), None)


def client_calls(calls: Sequence[ToolCall], offer: ToolOffer | None) -> list[ToolCall]:
    """``calls`` (model names) as the client sees them: in its own tool names."""
    return [offer.shown(call) if offer is not None else call for call in calls]
