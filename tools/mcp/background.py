"""An MCP tool call run in the background (``background: true``): a unit of the delegation
runtime, so it is a ledger row written before the call starts and its result comes home to
the conversation as a wake-up, exactly like a background sub-agent's.

The call runs on the connection's loop (the server's session lives there) while the unit's
worker thread waits for it; cancelling the unit (``cancel_delegation``, a server stopping
past its drain) cancels the call, which the SDK tells the MCP server. The turn that started
it has ended, so nobody is there to answer a server's question: elicitation is declined.

A tool with MCP task support (``execution.taskSupport`` ``optional``, or ``required``) is
called task-augmented instead (``tools.mcp.tasks``): the unit records the server's task id on
its row, follows the task and fetches its result, so a server restarted after a SIGKILL (or
another sharing the store) adopts it; cancelling the unit sends ``tasks/cancel``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import uuid
from dataclasses import replace
from typing import Any

from agent.messages import JSONObject
from agent.tools import ToolContext
from tools.delegation_runtime import current_unit, get_runtime
from tools.mcp.connection import McpCallResult, McpConnection
from tools.mcp.tasks import (
    MCP_TASK,
    TaskRef,
    cancel_task,
    create_task,
    follow,
    on_loop,
    record_task,
)

_GOAL_ARGS = 300


async def dispatch_call(
    connection: McpConnection,
    tool: str,
    name: str,
    arguments: JSONObject,
    ctx: ToolContext,
    *,
    as_task: bool = False,
) -> JSONObject:
    """Start ``tool`` (the agent's ``name``) in the background, as an MCP task when
    ``as_task``; answers at once with the dispatch outcome (``dispatched`` / ``queued`` /
    ``rejected``, ``delegation_id``)."""
    home = connection.loop
    if home is None:
        return {"error": f"MCP server {connection.name} is not started"}
    # No one answers questions for a call whose turn has ended.
    quiet = replace(ctx, confirm=None, confirm_unit=None, on_progress=None)
    running: list[concurrent.futures.Future[Any]] = []
    task = _TaskUnit(connection, tool, name, arguments) if as_task else None

    def run() -> JSONObject:
        if task is not None:
            return task.run()
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
        if task is not None:
            task.stop()
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


class _TaskUnit:
    """The runner of a background call sent as an MCP task (see the module docstring)."""

    def __init__(
        self, connection: McpConnection, tool: str, name: str, arguments: JSONObject
    ) -> None:
        self.connection = connection
        self.tool = tool
        self.name = name
        self.arguments = arguments
        self.ref: TaskRef | None = None
        self.row_id: str | None = None
        self.following: concurrent.futures.Future[JSONObject] | None = None
        self.stopped = False

    def run(self) -> JSONObject:
        unit = current_unit()
        runtime, self.row_id = unit if unit is not None else (get_runtime(), None)
        token = self.row_id or uuid.uuid4().hex  # the task's progress comes under it
        made = on_loop(
            self.connection, create_task(self.connection, self.tool, self.arguments, token)
        )
        answer = made.result()
        if isinstance(answer, McpCallResult):  # refused, or answered at once
            if answer.is_error:
                return {"status": "failed", "error": answer.text or f"{self.name} failed"}
            return {"status": "completed", "summary": answer.text}
        self.ref = TaskRef(self.connection.name, answer.task_id)
        row_id = self.row_id
        if row_id is not None and not record_task(runtime, row_id, self.ref):
            # The row ended meanwhile (cancelled before the server answered).
            self._cancel_remote()
            return {"status": "cancelled", "error": f"{self.name} was cancelled"}
        if row_id is not None:
            runtime.outlives_server(row_id)  # a drain leaves it to the next server
        if self.stopped:  # stopped while the server was answering: nothing was sent yet
            if not runtime.draining:
                self._cancel_remote()
            return {"status": "cancelled", "error": f"{self.name} was cancelled"}

        def report(step: str | None, line: str | None) -> None:
            if row_id is not None:
                runtime.progress(row_id, step=step, line=line)

        self.following = on_loop(
            self.connection, follow(self.connection, answer.task_id, report, token)
        )
        if self.stopped:  # stopped just now: ``stop`` found no follower to cancel
            self.following.cancel()
        try:
            result = self.following.result()
        except concurrent.futures.CancelledError:
            result = {"status": "cancelled", "error": f"{self.name} was cancelled"}
        # The terminal event restates the request the row kept, the task with it.
        return {**result, MCP_TASK: self.ref.as_json()}

    def stop(self) -> None:
        """The unit is stopped: cancelled (from any surface), which sends ``tasks/cancel``,
        or drained (the server stopping), which only stops following: the task goes on at
        the MCP server and the next server adopts it."""
        self.stopped = True
        if self.following is not None:
            self.following.cancel()
        if not get_runtime().draining:
            self._cancel_remote()

    def _cancel_remote(self) -> None:
        if self.ref is not None:
            with contextlib.suppress(RuntimeError):  # the connection's loop is closed
                on_loop(self.connection, cancel_task(self.connection, self.ref.task_id))
