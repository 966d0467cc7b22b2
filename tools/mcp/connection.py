"""One MCP server's long-lived client session, on the event loop that started it.

The connection connects (a stdio subprocess or streamable HTTP), lists the server's tools,
keeps the session open, and re-lists them on ``notifications/tools/list_changed``. A server
that fails to start, or whose session is lost (a stdio server that exited, a call that found
the connection closed), is reconnected with exponential backoff. Its state is ``starting``
until the first attempt ends, then ``ready``, or ``failed`` (with the last error) until an
attempt succeeds again, for ``reveille mcp list`` and the agent's error texts. A call that
outlives the server's ``timeout_seconds`` is cancelled (the SDK sends
``notifications/cancelled``) and answered with an error.

Elicitation (``elicitation/create``) is asked through the confirmation hook of the turn whose
call is in flight (``ToolContext.confirm``: web UI card, Telegram keyboard, API approvals,
CLI), with its form attached (``tools.mcp.elicitation.asking_form``): a yes with values (the
API, the CLI) accepts with them, a bare yes with the form's defaults. A form a bare yes
cannot fill (a required field without a default) is declined with a log line, as is one
with no call in flight or with nobody to ask, a no, and one nobody answered before the
approval expired.

Sampling (``sampling/createMessage``) is answered by the process's model provider, after a
person's yes by default (``tools.mcp.sampling``; ``[mcp.servers.NAME] sampling``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Literal, TextIO

import anyio
import httpx2
import mcp_types as types
from anyio.streams.memory import MemoryObjectSendStream
from mcp.client.extension import NotificationBinding
from mcp.client.session import (
    ClientRequestContext,
    ClientSession,
    IncomingMessage,
    MessageHandlerFnT,
)
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared._stream_protocols import ReadStream, WriteStream
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

from agent.messages import JSONObject
from agent.providers.base import ModelProvider
from agent.tools import ApprovalExpired, ToolContext
from tools.mcp.config import McpServerConfig
from tools.mcp.elicitation import FormError, asking_form, parse_form
from tools.mcp.sampling import sample

logger = logging.getLogger(__name__)

State = Literal["starting", "ready", "failed"]
MIN_BACKOFF_SECONDS = 0.5
MAX_BACKOFF_SECONDS = 30.0


@dataclass(frozen=True)
class McpToolInfo:
    """A tool as the server lists it: its own name, what the model reads, and its
    ``readOnlyHint`` (which ``approvals = "unless_read_only"`` reads)."""

    name: str
    description: str
    parameters: JSONObject
    read_only: bool
    task_support: str = "forbidden"  # MCP tasks: "forbidden" | "optional" | "required"


@dataclass(frozen=True)
class McpCallResult:
    """A call's outcome for the agent: the text content joined, and whether it failed."""

    text: str
    is_error: bool


class McpConnection:
    """The session with one configured server (see the module's docstring)."""

    def __init__(
        self,
        config: McpServerConfig,
        *,
        on_tools: Callable[[McpConnection], None] | None = None,
        model: ModelProvider | None = None,
        min_backoff: float = MIN_BACKOFF_SECONDS,
        max_backoff: float = MAX_BACKOFF_SECONDS,
        auth: Callable[[], httpx2.Auth | None] | None = None,
    ) -> None:
        self.config = config
        # An HTTP server's OAuth (``tools.mcp.oauth``), made anew for each connection so it
        # starts from the store: tokens a login (or another server) put there since.
        self._auth = auth
        self.state: State = "starting"
        self.last_error = ""
        self.tools: tuple[McpToolInfo, ...] = ()
        self.restarts = 0
        self._on_tools = on_tools
        self.model = model  # what answers the server's sampling requests
        self._min_backoff = min_backoff
        self._max_backoff = max_backoff
        self._session: ClientSession | None = None
        self._lost: anyio.Event | None = None
        self._settled = asyncio.Event()  # set once the first attempt ended either way
        self._task: asyncio.Task[None] | None = None
        self._callers: list[ToolContext] = []
        self._was_ready = False
        self.loop: asyncio.AbstractEventLoop | None = None
        # MCP tasks followed here (``tools.mcp.tasks``): task id -> told of a status change,
        # progress token -> told of its progress.
        self._task_watchers: dict[str, Callable[[types.TaskStatusNotificationParams], None]] = {}
        self._progress_watchers: dict[str, Callable[[types.ProgressNotificationParams], None]] = {}

    @property
    def name(self) -> str:
        return self.config.name

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._run(), name=f"mcp:{self.name}")

    async def wait_settled(self, timeout: float) -> None:
        """Wait until the first connection attempt succeeded or failed (at most ``timeout``)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._settled.wait()

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _run(self) -> None:
        failures = 0
        while True:
            # A retry leaves the state "failed": a server that is down stays so, with its
            # reason, until it is back, whenever anyone looks.
            self._was_ready = False
            try:
                await self._session_until_lost()
                reason = "the session ended (the server exited or closed the connection)"
            except Exception as exc:  # any failure to connect: try again later
                reason = _reason(exc)
            # A session that was up starts the backoff over; failed starts lengthen it.
            failures = 1 if self._was_ready else failures + 1
            self._session = None
            self.state = "failed"
            self.last_error = reason
            self._settled.set()
            delay = min(self._max_backoff, self._min_backoff * 2 ** (failures - 1))
            logger.warning("MCP server %s: %s; reconnecting in %.1f s", self.name, reason, delay)
            await asyncio.sleep(delay)
            self.restarts += 1

    async def _session_until_lost(self) -> None:
        lost = anyio.Event()
        self._lost = lost
        async with self._transport() as (read, write):
            # The session reads through this pipe so the end of the server's stream (a
            # stdio server that exited) is seen even while no call is in flight.
            send, receive = anyio.create_memory_object_stream[SessionMessage | Exception](16)
            async with anyio.create_task_group() as group:
                group.start_soon(_forward, read, send, lost)
                async with ClientSession(
                    receive,
                    write,
                    message_handler=self._message_handler(group),
                    elicitation_callback=self._elicit,
                    # "deny": the capability is not offered at all.
                    sampling_callback=None if self.config.sampling == "deny" else self._sample,
                    notification_bindings=self._task_bindings(),
                ) as session:
                    await session.initialize()
                    await self._list(session)
                    self._session = session
                    self.state = "ready"
                    self._was_ready = True
                    self.last_error = ""
                    self._settled.set()
                    logger.info("MCP server %s: ready, %d tool(s)", self.name, len(self.tools))
                    await lost.wait()
                    self.state = "failed"
                group.cancel_scope.cancel()

    @contextlib.asynccontextmanager
    async def _transport(
        self,
    ) -> AsyncIterator[tuple[ReadStream[SessionMessage | Exception], WriteStream[SessionMessage]]]:
        if self.config.command:
            program, *args = self.config.command
            params = StdioServerParameters(command=program, args=args, env=dict(self.config.env))
            async with stdio_client(params, errlog=_errlog()) as streams:
                yield streams
            return
        # Header values (secrets) go only into the client; nothing here logs them.
        auth = None if self._auth is None else self._auth()
        async with (
            create_mcp_http_client(headers=dict(self.config.headers), auth=auth) as http,
            streamable_http_client(self.config.url, http_client=http) as streams,
        ):
            yield streams

    def _message_handler(self, group: anyio.abc.TaskGroup) -> MessageHandlerFnT:
        async def handle(message: IncomingMessage) -> None:
            if isinstance(message, types.ToolListChangedNotification):
                session = self._session
                if session is not None:
                    group.start_soon(self._relist, session)
            elif isinstance(message, types.ProgressNotification):
                self._progressed(message.params)

        return handle

    async def _relist(self, session: ClientSession) -> None:
        try:
            await self._list(session)
        except Exception as exc:
            logger.warning("MCP server %s: re-listing tools failed: %s", self.name, exc)
            return
        logger.info("MCP server %s: tools changed, now %d", self.name, len(self.tools))

    async def _list(self, session: ClientSession) -> None:
        listed: list[McpToolInfo] = []
        cursor: str | None = None
        while True:
            params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await session.list_tools(params=params)
            listed.extend(_info(tool) for tool in page.tools if self.config.takes(tool.name))
            cursor = page.next_cursor
            if not cursor:
                break
        self.tools = tuple(listed)
        if self._on_tools is not None:
            self._on_tools(self)

    async def call(self, tool: str, arguments: JSONObject, ctx: ToolContext) -> McpCallResult:
        """Call ``tool`` on this connection's loop (see ``call_from_anywhere``)."""
        session = self._session
        if session is None or self.state != "ready":
            why = f" ({self.last_error})" if self.last_error else ""
            return McpCallResult(
                f"MCP server {self.name} is not available: {self.state}{why}", True
            )
        self._callers.append(ctx)
        try:
            async with asyncio.timeout(self.config.timeout_seconds):
                result = await session.call_tool(tool, arguments)
        except TimeoutError:
            return McpCallResult(
                f"{tool} on MCP server {self.name} took longer than "
                f"{self.config.timeout_seconds:g} s and was cancelled",
                True,
            )
        except MCPError as exc:
            if exc.code == types.CONNECTION_CLOSED and self._lost is not None:
                self._lost.set()
            return McpCallResult(f"MCP server {self.name}: {exc.error.message}", True)
        finally:
            self._callers.remove(ctx)
        return McpCallResult(result_text(result), bool(result.is_error))

    async def call_from_anywhere(
        self, tool: str, arguments: JSONObject, ctx: ToolContext
    ) -> McpCallResult:
        """Call ``tool`` from any thread's loop (a sub-agent's): the session lives on the loop
        that started the connection, so the call runs there."""
        home = self.loop
        if home is None or home is asyncio.get_running_loop():
            return await self.call(tool, arguments, ctx)
        if home.is_closed():
            return McpCallResult(f"MCP server {self.name} is stopped", True)
        future = asyncio.run_coroutine_threadsafe(self.call(tool, arguments, ctx), home)
        return await asyncio.wrap_future(future)

    # -- MCP tasks: the session, and status notifications, for ``tools.mcp.tasks`` --------------

    def ready_session(self) -> ClientSession | None:
        """The session, while the server is ready (on this connection's loop)."""
        return self._session if self.state == "ready" else None

    def watch_task(
        self, task_id: str, told: Callable[[types.TaskStatusNotificationParams], None] | None
    ) -> None:
        """Call ``told`` with each ``notifications/tasks/status`` of ``task_id`` (None: stop)."""
        if told is None:
            self._task_watchers.pop(task_id, None)
        else:
            self._task_watchers[task_id] = told

    def watch_progress(
        self, token: str, told: Callable[[types.ProgressNotificationParams], None] | None
    ) -> None:
        """Call ``told`` with each ``notifications/progress`` of ``token`` (None: stop); a
        task's progress goes on under its call's token after the call was answered."""
        if told is None:
            self._progress_watchers.pop(token, None)
        else:
            self._progress_watchers[token] = told

    def _progressed(self, params: types.ProgressNotificationParams) -> None:
        told = self._progress_watchers.get(str(params.progress_token))
        if told is not None:
            told(params)

    def _task_bindings(self) -> list[NotificationBinding[types.TaskStatusNotificationParams]]:
        async def status(params: types.TaskStatusNotificationParams) -> None:
            told = self._task_watchers.get(params.task_id)
            if told is not None:
                told(params)

        return [
            NotificationBinding(
                method="notifications/tasks/status",
                params_type=types.TaskStatusNotificationParams,
                handler=status,
            )
        ]

    async def _elicit(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        """A server's form, asked through the confirmation hook of the call in flight: a
        yes answers with the form's defaults (``tools.mcp.elicitation``); a form a yes
        cannot answer, no call or nobody to ask, a no, or no answer in time declines."""
        decline = types.ElicitResult(action="decline")
        if not isinstance(params, types.ElicitRequestFormParams):
            logger.warning(
                "MCP server %s asked for a URL elicitation; declined (not supported)", self.name
            )
            return decline
        try:
            form = parse_form(params.message, _schema(params.requested_schema))
        except FormError as exc:
            logger.warning(
                "MCP server %s asked with a form Reveille cannot show (%s); declined",
                self.name,
                exc,
            )
            return decline
        ctx = self._callers[-1] if self._callers else None
        if ctx is None or ctx.confirm is None:
            logger.warning(
                "MCP server %s asked a question with nobody to ask (no approvals on this "
                "conversation's surface); declined",
                self.name,
            )
            return decline
        try:
            with asking_form(_schema(params.requested_schema)) as question:
                yes = await ctx.confirm(form.prompt(self.name))
        except ApprovalExpired:
            logger.warning("MCP server %s's question expired unanswered; declined", self.name)
            return decline
        if not yes:
            return decline
        # The values a person gave (API, CLI), else what a plain yes answers.
        content = question.answer if question.answer is not None else form.yes_answer()
        if content is None:
            logger.warning(
                "MCP server %s asked for input a yes/no cannot give (required fields without "
                "defaults: %s); declined",
                self.name,
                ", ".join(f.name for f in form.fields if f.required and f.default is None),
            )
            return decline
        return types.ElicitResult(action="accept", content=content)

    async def _sample(
        self, context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult | types.ErrorData:
        """``sampling/createMessage`` (``tools.mcp.sampling``), asked of the call in flight."""
        return await sample(
            self.name,
            self.model,
            params,
            ask=self.config.sampling == "ask",
            caller=self._callers[-1] if self._callers else None,
        )


async def _forward(
    read: ReadStream[SessionMessage | Exception],
    send: MemoryObjectSendStream[SessionMessage | Exception],
    lost: anyio.Event,
) -> None:
    """Pass the transport's messages on; when its stream ends, the session is lost."""
    try:
        async with send:
            async for message in read:
                await send.send(message)
    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
        pass
    finally:
        lost.set()


def _errlog() -> TextIO:
    """Where a stdio server's stderr goes: ours, or the process's own when ours is no file
    (a captured stream has no descriptor for the child to write to)."""
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return sys.__stderr__ or sys.stderr
    return sys.stderr


def _info(tool: types.Tool) -> McpToolInfo:
    schema = dict(tool.input_schema or {})
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    annotations = tool.annotations
    return McpToolInfo(
        name=tool.name,
        description=tool.description or tool.title or tool.name,
        parameters=schema,
        read_only=bool(annotations is not None and annotations.read_only_hint),
        task_support=(tool.execution.task_support if tool.execution else None) or "forbidden",
    )


def json_object(value: object) -> JSONObject:
    """``value`` when it is a JSON object (a schema's ``properties`` ...), else an empty one."""
    return value if isinstance(value, dict) else {}


def _schema(requested: object) -> JSONObject:
    dump = getattr(requested, "model_dump", None)
    value = dump(by_alias=True, exclude_none=True) if callable(dump) else requested
    return json_object(value)


def result_text(result: types.CallToolResult) -> str:
    """The text content joined; other content named; structured content when no text."""
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
        else:
            parts.append(f"[{getattr(block, 'type', 'content')}]")
    texts = any(isinstance(b, types.TextContent) for b in result.content)
    if not texts and result.structured_content is not None:
        parts.insert(0, json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)


def _reason(exc: BaseException) -> str:
    """What went wrong, for the log and ``last_error``: a task group's failure is told by
    the first error it holds (an OAuth server's "run reveille mcp login NAME", say)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
