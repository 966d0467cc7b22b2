"""An MCP tool call run in the background (``background: true``): a unit of the delegation
runtime, so it is a ledger row written before the call starts and its result comes home to
the conversation as a wake-up, exactly like a background sub-agent's.

The call runs on the connection's loop (the server's session lives there) while the unit's
worker thread waits for it; cancelling the unit (``cancel_delegation``, a server stopping
past its drain) cancels the call, which the SDK tells the MCP server. The turn that started
it has ended, so nobody is there to answer a server's question: elicitation is declined.
This is Reveille's own background unit; MCP's task-augmented calls (a task id the server
keeps, followed after a restart) are not used yet.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from dataclasses import replace
from typing import Any

from agent.messages import JSONObject
from agent.tools import ToolContext
from tools.mcp.connection import McpConnection

_GOAL_ARGS = 300


async def dispatch_call(
    connection: McpConnection, tool: str, name: str, arguments: JSONObject, ctx: ToolContext
) -> JSONObject:
    """Start ``tool`` (the agent's ``name``) in the background; answers at once with the
    dispatch outcome (``dispatched`` / ``queued`` / ``rejected``, ``delegation_id``)."""
    home = connection.loop
    if home is None:
        return {"error": f"MCP server {connection.name} is not started"}
    # No one answers questions for a call whose turn has ended.
    quiet = replace(ctx, confirm=None, confirm_unit=None, on_progress=None)
    running: list[concurrent.futures.Future[Any]] = []

    def run() -> JSONObject:
        future = asyncio.run_coroutine_threadsafe(connection.call(tool, arguments, quiet), home)
        running.append(future)
        try:
            result = future.result()
        except concurrent.futures.CancelledError:
            return {"status": "cancelled", "error": f"{name} was cancelled"}
        if result.is_error:
            return {"status": "failed", "error": result.text or f"{name} failed"}
        return {"status": "completed", "summary": result.text}

    def stop() -> None:
        for future in running:
            future.cancel()

    shown = json.dumps(arguments, ensure_ascii=False)
    if len(shown) > _GOAL_ARGS:
        shown = shown[: _GOAL_ARGS - 1] + "…"
    await ctx.prepare_background()  # its origin session is written before any result
    from tools.async_delegation import dispatch_async_delegation

    dispatched = await asyncio.to_thread(
        lambda: dispatch_async_delegation(
            goal=f"call {name} with {shown}",
            toolsets=[connection.config.toolset],
            session_key=ctx.session_key,
            origin_session_id=ctx.session_id,
            origin_ui_session_id=ctx.origin_ui_session_id,
            runner=run,
            interrupt_fn=stop,
        )
    )
    return json.loads(json.dumps(dispatched, default=str))
