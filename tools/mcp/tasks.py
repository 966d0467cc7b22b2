"""MCP tasks (spec 2025-11-25) as Reveille background work: a task-augmented ``tools/call``
answered with a task id, followed with ``tasks/get`` (at the server's ``pollInterval``, and at
once on ``notifications/tasks/status``) until it ends, its result fetched with ``tasks/result``,
and ``tasks/cancel`` sent when the unit is cancelled.

The unit's ledger row is written before the call (``tools.mcp.background``); once the server
answers, the task's server and id go on the row's stored request (``mcp_task``), so the work
outlives this process: after a SIGKILL, the ledger's recovery hands the running row to
``McpTasks.adopt`` in whichever server takes it over (this one restarted, or another sharing
the PostgreSQL store), which follows the task on and records its end. A delegation row
without a task is declined and settles ``unknown`` as before.

The SDK (``mcp`` 2.3) has the tasks' types but validates a ``tools/call`` answer as a
``CallToolResult`` only; the task-augmented call alone is therefore sent through the
session's dispatcher and its ``CreateTaskResult`` validated here. ``tasks/get``,
``tasks/result`` and ``tasks/cancel`` go through ``ClientSession.send_request``, and status
notifications arrive through a ``NotificationBinding`` (``McpConnection.watch_task``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import mcp_types as types
from mcp.client.session import ClientSession
from mcp.shared.dispatcher import CallOptions
from mcp.shared.exceptions import MCPError

from agent.messages import JSONObject
from delivery.backend import LedgerTx
from delivery.rows import LedgerRow
from delivery.states import State
from tools.delegation_runtime import DelegationRuntime
from tools.delegation_units import completion_event
from tools.mcp.connection import McpCallResult, McpConnection, result_text

log = logging.getLogger(__name__)

MCP_TASK = "mcp_task"
"""The key, on a row's stored request, of the MCP task it follows: ``{"server", "task_id"}``."""
TASK_TTL_MS = 24 * 3600 * 1000  # asked of the server: keep the task a day
DEFAULT_POLL_SECONDS = 1.0
MIN_POLL_SECONDS = 0.05
MAX_POLL_SECONDS = 30.0
RECONNECT_SECONDS = 0.5
ADOPT_WAIT_SECONDS = 60.0  # how long an adopted task waits for its server to be configured
_TRANSIENT = frozenset({types.CONNECTION_CLOSED})

T = TypeVar("T")


@dataclass(frozen=True)
class TaskRef:
    """The MCP task a ledger row follows."""

    server: str
    task_id: str

    def as_json(self) -> JSONObject:
        return {"server": self.server, "task_id": self.task_id}

    @staticmethod
    def of(request: JSONObject | None) -> TaskRef | None:
        """The task recorded on a row's stored request, if any."""
        found = (request or {}).get(MCP_TASK)
        if not isinstance(found, dict):
            return None
        server, task_id = found.get("server"), found.get("task_id")
        if isinstance(server, str) and isinstance(task_id, str) and server and task_id:
            return TaskRef(server, task_id)
        return None


def uses_task(task_support: str, background: bool) -> bool:
    """Whether a call is sent task-augmented: the tool requires it, or allows it and the
    call runs in the background."""
    return task_support == "required" or (task_support == "optional" and background)


# -- the requests ---------------------------------------------------------------------------------


async def create_task(
    connection: McpConnection, tool: str, arguments: JSONObject, progress_token: str
) -> types.Task | McpCallResult:
    """Send ``tool`` task-augmented, asking for progress under ``progress_token``; the
    server's task, or its answer when it ran the call at once (a server may), or an error."""
    session = connection.ready_session()
    if session is None:
        why = f" ({connection.last_error})" if connection.last_error else ""
        return McpCallResult(
            f"MCP server {connection.name} is not available: {connection.state}{why}", True
        )
    request = types.CallToolRequest(
        params=types.CallToolRequestParams(
            name=tool,
            arguments=arguments,
            task=types.TaskMetadata(ttl=TASK_TTL_MS),
            _meta=types.RequestParamsMeta(progress_token=progress_token),
        )
    )
    try:
        raw = await _send_unvalidated(session, request)
    except MCPError as exc:
        return McpCallResult(f"MCP server {connection.name}: {exc.error.message}", True)
    if "task" in raw:
        return types.CreateTaskResult.model_validate(raw, by_name=False).task
    answer = types.CallToolResult.model_validate(raw, by_name=False)
    return McpCallResult(result_text(answer), bool(answer.is_error))


async def _send_unvalidated(session: ClientSession, request: types.CallToolRequest) -> JSONObject:
    """What the SDK lacks: a ``tools/call`` whose answer may be a ``CreateTaskResult``. The
    request is stamped as ``send_request`` stamps it; only its result check is skipped."""
    data = request.model_dump(by_alias=True, mode="json", exclude_none=True)
    opts: CallOptions = {}
    session._stamp(data, opts)  # private: the SDK has no public raw request
    raw: JSONObject = await session._dispatcher.send_raw_request(
        data["method"], data.get("params"), opts
    )
    return raw


async def cancel_task(connection: McpConnection, task_id: str) -> bool:
    """Send ``tasks/cancel``; whether the server took it."""
    session = connection.ready_session()
    if session is None:
        return False
    request = types.CancelTaskRequest(params=types.CancelTaskRequestParams(task_id=task_id))
    try:
        await session.send_request(request, types.CancelTaskResult)
    except MCPError as exc:
        log.warning("MCP server %s: tasks/cancel %s: %s", connection.name, task_id, exc)
        return False
    log.info("MCP server %s: task %s cancelled", connection.name, task_id)
    return True


Report = Callable[[str | None, str | None], None]
"""Where a followed task's progress goes: ``(step, line)``, the task's status and its last
progress notification (the running-work view shows both)."""


async def follow(
    connection: McpConnection, task_id: str, report: Report, progress_token: str | None = None
) -> JSONObject:
    """Follow ``task_id`` to its end; the unit's result (``status`` and ``summary`` or
    ``error``). A lost connection is waited out; a server that no longer knows the task
    (or any other error answer to ``tasks/get``) ends it ``failed`` with that reason."""
    changed = asyncio.Event()

    def told(params: types.TaskStatusNotificationParams) -> None:
        report(_status_line(params.status, params.status_message), None)
        changed.set()

    connection.watch_task(task_id, told)
    if progress_token is not None:
        connection.watch_progress(
            progress_token, lambda params: report(None, _progress_line(params))
        )
    last = ""
    try:
        while True:
            session = connection.ready_session()
            if session is None:
                await asyncio.sleep(RECONNECT_SECONDS)
                continue
            request = types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=task_id))
            changed.clear()
            try:
                task = await session.send_request(request, types.GetTaskResult)
            except MCPError as exc:
                if exc.code in _TRANSIENT:
                    await asyncio.sleep(RECONNECT_SECONDS)
                    continue
                return {
                    "status": "failed",
                    "error": f"MCP server {connection.name} no longer knows task {task_id}: "
                    f"{exc.error.message}",
                }
            shown = _status_line(task.status, task.status_message)
            if shown != last:
                last = shown
                report(shown, None)
            if task.status == "completed":
                return await _result(connection, session, task_id)
            if task.status in ("failed", "cancelled"):
                reason = task.status_message or f"the MCP task {task.status}"
                return {"status": task.status, "error": reason}
            interval = (task.poll_interval or DEFAULT_POLL_SECONDS * 1000) / 1000
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(max(interval, MIN_POLL_SECONDS), MAX_POLL_SECONDS)):
                    await changed.wait()
    finally:
        connection.watch_task(task_id, None)
        if progress_token is not None:
            connection.watch_progress(progress_token, None)


def _status_line(status: str, message: str | None) -> str:
    return f"MCP task {status}: {message}" if message else f"MCP task {status}"


def _progress_line(params: types.ProgressNotificationParams) -> str:
    done = f"{params.progress:g}/{params.total:g}" if params.total else f"{params.progress:g}"
    return f"{done} {params.message}" if params.message else done


async def _result(connection: McpConnection, session: ClientSession, task_id: str) -> JSONObject:
    request = types.GetTaskPayloadRequest(params=types.GetTaskPayloadRequestParams(task_id=task_id))
    try:
        answer = await session.send_request(request, types.CallToolResult)
    except MCPError as exc:
        return {
            "status": "failed",
            "error": f"MCP server {connection.name}: tasks/result {task_id}: {exc.error.message}",
        }
    text = result_text(answer)
    if answer.is_error:
        return {"status": "failed", "error": text or "the MCP task's result is an error"}
    return {"status": "completed", "summary": text}


# -- the row, and work that outlives this process ------------------------------------------------


def record_task(runtime: DelegationRuntime, row_id: str, ref: TaskRef) -> bool:
    """Put the task on the running row's stored request (durably, before it is followed)."""
    ledger = runtime.ledger
    row = ledger.get(row_id)
    if row is None:
        return False
    request: JSONObject = {**(row.request or {}), MCP_TASK: ref.as_json()}
    now = ledger.clock()

    def op(tx: LedgerTx) -> bool:
        if not tx.update(row_id, {"state": State.RUNNING.value}, {"request": request}):
            return False
        tx.audit(row_id, "mcp_task", f"MCP server {ref.server} task {ref.task_id}", now)
        return True

    return bool(ledger.backend.write(op))


def on_loop(
    connection: McpConnection, coro: Coroutine[Any, Any, T]
) -> concurrent.futures.Future[T]:
    """Run ``coro`` on the connection's loop (its session lives there)."""
    home = connection.loop
    if home is None or home.is_closed():
        coro.close()
        raise RuntimeError(f"MCP server {connection.name} is stopped")
    return asyncio.run_coroutine_threadsafe(coro, home)


class McpTasks:
    """Adopts the MCP-task rows of a dead server and cancels orphaned ones (see the module
    docstring); ``attach`` makes it the ledger's adopter of delegation rows."""

    def __init__(self) -> None:
        self._runtime: DelegationRuntime | None = None
        self._lookup: Callable[[str], McpConnection | None] = lambda name: None

    def attach(
        self, runtime: DelegationRuntime, lookup: Callable[[str], McpConnection | None]
    ) -> None:
        self._runtime = runtime
        self._lookup = lookup
        runtime.ledger.set_adopter("delegation", self.adopt)
        runtime.set_orphan_stopper("delegation", self.cancel_orphan)

    def adopt(self, row: LedgerRow) -> bool:
        """Follow the task of ``row`` (now owned here); False for a row without one."""
        ref = TaskRef.of(row.request)
        runtime = self._runtime
        if ref is None or runtime is None:
            return False
        log.info("adopted MCP task %s of server %s (%s)", ref.task_id, ref.server, row.id)
        threading.Thread(
            target=self._follow_adopted, args=(runtime, row, ref), name=f"mcp-{row.id}", daemon=True
        ).start()
        return True

    def _connection(self, name: str) -> McpConnection | None:
        deadline = time.monotonic() + ADOPT_WAIT_SECONDS
        while (found := self._lookup(name)) is None and time.monotonic() < deadline:
            time.sleep(RECONNECT_SECONDS)
        return found

    def _follow_adopted(self, runtime: DelegationRuntime, row: LedgerRow, ref: TaskRef) -> None:
        request: JSONObject = dict(row.request or {})
        started = row.started_at or row.created_at
        connection = self._connection(ref.server)
        if connection is None:
            result: JSONObject | None = {
                "status": "failed",
                "error": f"MCP server {ref.server} is not configured on this Reveille server",
            }
        else:
            result = self._follow_here(runtime, row.id, connection, ref)
        if result is None:
            # This server is stopping: the task goes on at its server, and the row stays
            # running for the next server to adopt.
            log.info("stopped following MCP task %s (%s); left running", ref.task_id, row.id)
            return
        runtime.record_completion(
            row.id, completion_event(request, {**result, "adopted": True}, started)
        )

    def _follow_here(
        self, runtime: DelegationRuntime, row_id: str, connection: McpConnection, ref: TaskRef
    ) -> JSONObject | None:
        """The task's end, or None when following it stopped without a cancel."""
        cancelled = threading.Event()
        try:
            following = on_loop(
                connection,
                follow(
                    connection,
                    ref.task_id,
                    lambda step, line: runtime.progress(row_id, step=step, line=line),
                ),
            )
        except RuntimeError:  # the connection's loop is closed: this server is stopping
            return None

        def stop() -> None:
            cancelled.set()
            following.cancel()
            with contextlib.suppress(RuntimeError):
                on_loop(connection, cancel_task(connection, ref.task_id))

        runtime.watch(row_id, stop)
        try:
            return following.result()
        except concurrent.futures.CancelledError:
            if not cancelled.is_set():
                return None  # the loop went away under it
            return {"status": "cancelled", "error": "cancelled"}
        finally:
            runtime.unwatch(row_id)

    def cancel_orphan(self, row_id: str) -> None:
        """A cancelled row whose owner died before anyone adopted it: cancel its task."""
        runtime = self._runtime
        row = runtime.ledger.get(row_id) if runtime is not None else None
        ref = TaskRef.of(row.request) if row is not None else None
        connection = self._lookup(ref.server) if ref is not None else None
        if ref is not None and connection is not None:
            with contextlib.suppress(RuntimeError):
                on_loop(connection, cancel_task(connection, ref.task_id))


mcp_tasks = McpTasks()
