"""An MCP server that answers task-augmented ``tools/call`` (MCP 2025-11-25 tasks), written
with the SDK's low-level server, for the tests; it serves streamable HTTP on the port given
(``python task_server.py PORT LOGFILE``) so it outlives the Reveille server that calls it.

Tools: ``brew`` (``seconds``, ``what``, ``forget``; ``taskSupport: optional``: as a task it
works for ``seconds`` in five steps, each sent as progress (under the call's progress token)
and as a ``notifications/tasks/status``, then answers ``brewed <what>``;
with ``forget`` the server drops the task after its first step; ``poll_ms`` is the
``pollInterval`` it asks for), ``steep`` (the same, ``taskSupport: required``), ``plain``
(no task support).
Each task made, step taken, ``tasks/cancel`` and ``tasks/result`` is a line of LOGFILE, so
a test sees what reached the server. A task id the server never made is ``unknown task``.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import mcp_types as types
import uvicorn
from mcp.server.context import CallNext, ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.session import ServerSession
from mcp.shared.exceptions import MCPError

POLL_MS = 200


@dataclass
class _Task:
    task_id: str
    seconds: float
    what: str
    forget: bool = False
    poll_ms: int = POLL_MS
    status: types.TaskStatus = "working"
    message: str = "brewing"
    created: str = field(default_factory=lambda: datetime.now(UTC).isoformat())
    done: asyncio.Event = field(default_factory=asyncio.Event)
    runner: asyncio.Task[None] | None = None
    session: ServerSession | None = None  # where its notifications go
    progress_token: str | int | None = None

    def view(self) -> dict[str, Any]:
        return {
            "taskId": self.task_id,
            "status": self.status,
            "statusMessage": self.message,
            "createdAt": self.created,
            "lastUpdatedAt": datetime.now(UTC).isoformat(),
            "ttl": 600_000,
            "pollInterval": self.poll_ms,
        }


def build(log: Path) -> Server[Any]:
    tasks: dict[str, _Task] = {}

    def record(line: str) -> None:
        with log.open("a") as out:
            out.write(line + "\n")

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        schema = {
            "type": "object",
            "properties": {
                "seconds": {"type": "number"},
                "what": {"type": "string"},
                "forget": {"type": "boolean"},
                "poll_ms": {"type": "integer"},
            },
        }
        return types.ListToolsResult(
            tools=[
                types.Tool(
                    name="brew",
                    description="Brew for some seconds (a task).",
                    input_schema=schema,
                    annotations=types.ToolAnnotations(read_only_hint=True),
                    execution=types.ToolExecution(task_support="optional"),
                ),
                types.Tool(
                    name="steep",
                    description="Steep (task support required).",
                    input_schema=schema,
                    annotations=types.ToolAnnotations(read_only_hint=True),
                    execution=types.ToolExecution(task_support="required"),
                ),
                types.Tool(
                    name="plain",
                    description="Answer at once (no task support).",
                    input_schema={"type": "object", "properties": {}},
                    annotations=types.ToolAnnotations(read_only_hint=True),
                ),
            ]
        )

    async def tell(task: _Task, step: int | None = None, steps: int = 5) -> None:
        """Progress under the call's token, and the task's status (the client may be gone)."""
        session = task.session
        if session is None:
            return
        with contextlib.suppress(Exception):
            if task.progress_token is not None and step is not None:
                await session.send_progress_notification(
                    task.progress_token, step, total=steps, message=f"{step} of {steps} steeped"
                )
            status = types.TaskStatusNotification(
                params=types.TaskStatusNotificationParams.model_validate(task.view())
            )
            await session.send_notification(status)  # type: ignore[arg-type]

    async def work(task: _Task) -> None:
        steps = 5
        for step in range(1, steps + 1):
            await asyncio.sleep(task.seconds / steps)
            task.message = f"brewing {step}/{steps}"
            record(f"step {task.task_id} {step}")
            await tell(task, step, steps)
            if task.forget:
                tasks.pop(task.task_id, None)
                record(f"forgot {task.task_id}")
                return
        task.status = "completed"
        task.message = "brewed"
        task.done.set()
        await tell(task)

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        args = params.arguments or {}
        if params.name == "steep":
            raise MCPError(types.INVALID_PARAMS, "steep must be called as a task")
        if params.name == "brew":  # not task-augmented: brewed inline
            await asyncio.sleep(float(args.get("seconds", 0)))
            return types.CallToolResult(content=[types.TextContent(text="brewed inline")])
        return types.CallToolResult(content=[types.TextContent(text="plain answer")])

    async def tasks_first(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> Any:
        """A task-augmented call is answered here with a ``CreateTaskResult``: the SDK's
        ``tools/call`` handler may only answer a ``CallToolResult``, and a middleware that
        answers itself owns the result."""
        raw = ctx.params if isinstance(ctx.params, dict) else {}
        if ctx.method != "tools/call" or "task" not in raw:
            return await call_next(ctx)
        args = raw.get("arguments") or {}
        task = _Task(
            uuid.uuid4().hex,
            float(args.get("seconds", 1)),
            str(args.get("what", "tea")),
            forget=bool(args.get("forget")),
            poll_ms=int(args.get("poll_ms", POLL_MS)),
        )
        task.session = ctx.session
        meta = raw.get("_meta") or {}
        task.progress_token = meta.get("progressToken")
        tasks[task.task_id] = task
        task.runner = asyncio.get_running_loop().create_task(work(task))
        record(f"created {task.task_id}")
        return {"task": task.view()}

    def find(task_id: str) -> _Task:
        task = tasks.get(task_id)
        if task is None:
            raise MCPError(types.INVALID_PARAMS, f"unknown task {task_id}")
        return task

    async def get(ctx: ServerRequestContext[Any], params: types.GetTaskRequestParams) -> Any:
        return find(params.task_id).view()

    async def result(
        ctx: ServerRequestContext[Any], params: types.GetTaskPayloadRequestParams
    ) -> Any:
        task = find(params.task_id)
        await task.done.wait()
        record(f"result {task.task_id}")
        if task.status == "cancelled":
            raise MCPError(types.INVALID_PARAMS, "the task was cancelled")
        return {"content": [{"type": "text", "text": f"brewed {task.what}"}], "isError": False}

    async def cancel(ctx: ServerRequestContext[Any], params: types.CancelTaskRequestParams) -> Any:
        task = find(params.task_id)
        if task.runner is not None:
            task.runner.cancel()
        task.status = "cancelled"
        task.message = "cancelled by the client"
        task.done.set()
        record(f"cancelled {task.task_id}")
        return task.view()

    server: Server[Any] = Server("tasks", on_list_tools=list_tools, on_call_tool=call_tool)
    server.add_request_handler("tasks/get", types.GetTaskRequestParams, get)
    server.add_request_handler("tasks/result", types.GetTaskPayloadRequestParams, result)
    server.add_request_handler("tasks/cancel", types.CancelTaskRequestParams, cancel)
    server.middleware.append(tasks_first)
    return server


if __name__ == "__main__":
    port, log = int(sys.argv[1]), Path(sys.argv[2])
    app = build(log).streamable_http_app()
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
