"""An MCP server written with the SDK for the elicitation and sampling tests; run as a script
it serves stdio.

Tools: ``profile`` asks a form whose fields all have defaults (string, integer, number,
enum, boolean), ``signup`` one with a required field and no default, ``ask_model`` asks
the client's model (``sampling/createMessage``). Each answers with what it got back.
"""

from __future__ import annotations

import json
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import SamplingMessage, TextContent, ToolAnnotations

PROFILE: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "title": "Your name", "default": "Ada"},
        "age": {"type": "integer", "default": 36},
        "score": {"type": "number", "default": 9.5},
        "color": {"type": "string", "enum": ["red", "green", "blue"], "default": "green"},
        "subscribed": {"type": "boolean", "default": True},
    },
    "required": ["name"],
}
SIGNUP: dict[str, Any] = {
    "type": "object",
    "properties": {
        "email": {"type": "string", "title": "E-mail address"},
        "plan": {"type": "string", "enum": ["free", "pro"], "default": "free"},
        "seats": {"type": "integer"},
    },
    "required": ["email"],
}


def build() -> MCPServer:
    server = MCPServer("forms")

    async def ask(ctx: Context, message: str, schema: dict[str, Any]) -> str:
        result = await ctx.request_context.session.elicit_form(
            message,
            schema,
            related_request_id=ctx.request_id,
        )
        return f"{result.action} {json.dumps(result.content, sort_keys=True)}"

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def profile(ctx: Context) -> str:
        """Ask for a profile (every field has a default)."""
        return await ask(ctx, "Your profile?", PROFILE)

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def signup(ctx: Context) -> str:
        """Ask for an e-mail address (required, no default)."""
        return await ask(ctx, "Sign up?", SIGNUP)

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def ask_model(prompt: str, ctx: Context) -> str:
        """Ask the client's model."""
        try:
            result = await ctx.request_context.session.create_message(
                [SamplingMessage(role="user", content=TextContent(type="text", text=prompt))],
                max_tokens=200,
                system_prompt="Answer briefly.",
                related_request_id=ctx.request_id,
            )
        except MCPError as exc:
            return f"refused {exc.code}: {exc.error.message}"
        content = result.content
        text = content.text if isinstance(content, TextContent) else str(content)
        return f"model {result.model} ({result.stop_reason}): {text}"

    return server


if __name__ == "__main__":
    build().run()
