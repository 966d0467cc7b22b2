"""The `delegate_task` tool: hands a goal to a sub-agent, inline or in the background.

Inline, the turn waits for the sub-agent's summary. In the background the work goes through
`tools.async_delegation`, which records it durably and later delivers the result back to
the session that asked; the tool itself returns a handle at once.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agent.loop import run_subagent_sync
from agent.providers.base import ModelProvider
from agent.tool_args import as_bool, as_optional_str, as_str_list
from agent.tools import Tool, ToolContext

PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "goal": {"type": "string", "description": "What the sub-agent should achieve."},
        "context": {
            "type": "string",
            "description": "Everything the sub-agent needs to know: it does not see this "
            "conversation.",
        },
        "background": {
            "type": "boolean",
            "description": "Run detached: return a handle now and bring the result back to "
            "this conversation when it is done.",
            "default": False,
        },
        "toolsets": {
            "type": "array",
            "items": {"type": "string"},
            "description": "Toolsets the sub-agent may use.",
        },
        "role": {"type": "string", "description": "A role for the sub-agent, e.g. 'researcher'."},
    },
    "required": ["goal"],
}

DESCRIPTION = (
    "Delegate a goal to a sub-agent. By default waits for its result; with background=true "
    "returns a handle (delegation_id) at once and the result arrives in this conversation "
    "later."
)


def make_delegate_tool(provider: ModelProvider, *, max_async_children: int = 3) -> Tool:
    """`delegate_task`, whose sub-agents run on `provider`."""

    async def handler(args: dict[str, Any], ctx: ToolContext) -> str | dict[str, Any]:
        goal = str(args.get("goal") or "").strip()
        if not goal:
            return {"error": "goal must not be empty"}
        context = as_optional_str(args.get("context"))
        if not as_bool(args.get("background")):
            # A worker thread, not the loop: the sub-agent runs its own event loop.
            outcome = await asyncio.to_thread(run_subagent_sync, provider, goal, context)
            if outcome.get("status") == "completed":
                return str(outcome.get("summary", ""))
            return {"error": f"the sub-agent failed: {outcome.get('error', 'unknown error')}"}

        await ctx.prepare_background()  # its origin session is written before any result
        # Lazy: the delivery machinery is only needed once something goes to the background.
        from tools.async_delegation import dispatch_async_delegation

        # Dispatch writes the durable ledger row before returning, so it must not block
        # the event loop.
        dispatched = await asyncio.to_thread(
            lambda: dispatch_async_delegation(
                goal=goal,
                context=context,
                toolsets=as_str_list(args.get("toolsets")),
                role=as_optional_str(args.get("role")),
                model=provider.name,
                session_key=ctx.session_key,
                origin_session_id=ctx.session_id,
                origin_ui_session_id=ctx.origin_ui_session_id,
                runner=lambda: run_subagent_sync(provider, goal, context),
                max_async_children=max_async_children,
            )
        )
        return json.loads(json.dumps(dispatched, default=str))

    return Tool(
        name="delegate_task", description=DESCRIPTION, parameters=PARAMETERS, handler=handler
    )
