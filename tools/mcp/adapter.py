"""An MCP server's tools as the agent's: each listed tool becomes an ``agent.tools.Tool``
named ``SERVER__tool`` (its inputSchema as parameters) in the toolset ``mcp:SERVER``.

A call asks a person first when the server's ``approvals`` setting says so (through
``ToolContext.confirm``, the path the shell tool takes), then runs on the connection's loop.
The result is the text content joined; an ``isError`` result, a timeout or a lost server
comes back as an error the model reads. ``background: true`` (an argument Reveille adds
unless the tool has its own) runs the call as a background unit (``tools.mcp.background``),
as an MCP task when the tool supports tasks; a tool that requires tasks always runs so.
"""

from __future__ import annotations

import json
import re

from agent.messages import JSONObject
from agent.tool_args import as_bool
from agent.tools import ApprovalExpired, Tool, ToolContext, tool_error
from tools.mcp.background import dispatch_call
from tools.mcp.connection import McpConnection, McpToolInfo, json_object
from tools.mcp.tasks import uses_task

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
MAX_NAME = 64  # what OpenAI-compatible endpoints accept as a function name
_ARGS_SHOWN = 500
BACKGROUND = "background"
_BACKGROUND_PARAMETER: JSONObject = {
    "type": "boolean",
    "description": "true: answer at once and run the call in the background; its result "
    "comes back to this conversation when it ends.",
}


def tool_name(server: str, tool: str) -> str:
    """The namespaced name the model calls: ``server__tool``, with characters a function
    name cannot hold replaced by ``_``, at most 64 characters."""
    return f"{server}__{_UNSAFE.sub('_', tool)}"[:MAX_NAME]


def make_tools(connection: McpConnection) -> list[Tool]:
    """The agent's tools for what ``connection`` lists now (a name two tools share after
    namespacing is taken once)."""
    made: dict[str, Tool] = {}
    for info in connection.tools:
        name = tool_name(connection.name, info.name)
        made.setdefault(name, _tool(connection, info, name))
    return list(made.values())


def _tool(connection: McpConnection, info: McpToolInfo, name: str) -> Tool:
    config = connection.config
    # Reveille's own argument, unless the server's tool has one of that name.
    declared = json_object(info.parameters.get("properties"))
    own = BACKGROUND in declared
    parameters = info.parameters
    if not own:
        properties: JSONObject = {**declared, BACKGROUND: _BACKGROUND_PARAMETER}
        parameters = {**parameters, "properties": properties}

    async def handler(args: JSONObject, ctx: ToolContext) -> str | JSONObject:
        background = not own and as_bool(args.pop(BACKGROUND, None))
        if config.asks(info.read_only):
            if ctx.confirm is None:
                return json.dumps(
                    {
                        "error": f"{name} needs a person's approval ([mcp.servers."
                        f"{config.name}] approvals = {config.approvals!r}) and this "
                        "conversation cannot ask for one",
                        "denied": True,
                    }
                )
            shown = json.dumps(args, ensure_ascii=False)
            if len(shown) > _ARGS_SHOWN:
                shown = shown[: _ARGS_SHOWN - 1] + "…"
            try:
                if not await ctx.confirm(f"MCP {name} {shown}"):
                    return json.dumps({"error": f"{name} was denied", "denied": True})
            except ApprovalExpired:
                return json.dumps(
                    {"error": f"nobody approved {name} in time; it did not run", "expired": True}
                )
        as_task = uses_task(info.task_support, background)
        if background or as_task:
            return await dispatch_call(connection, info.name, name, args, ctx, as_task=as_task)
        result = await connection.call_from_anywhere(info.name, args, ctx)
        if result.is_error:
            return tool_error(result.text or f"{name} failed")
        return result.text

    return Tool(
        name=name,
        description=f"[MCP {config.name}] {info.description}",
        parameters=parameters,
        handler=handler,
        toolset=config.toolset,
    )
