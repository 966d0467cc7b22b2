"""Tools the agent may call, and the registry that dispatches model tool calls to them.

The registry never raises into the agent loop: an unknown tool, malformed arguments or a
failing handler all come back as a JSON error string that the model reads and can act on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field, replace
from typing import Any

from opentelemetry import trace

from agent.messages import JSONObject, ToolCall, ToolSchema

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ToolProgress:
    """One tool step as it happens: ``phase`` "started" (with its arguments text) or
    "finished" (with ``ok`` and how long it took)."""

    call_id: str
    name: str
    phase: str
    ok: bool = True
    seconds: float = 0.0


ProgressCallback = Callable[[ToolProgress], Awaitable[None]]
ConfirmCallback = Callable[[str], Awaitable[bool]]
UnitConfirmCallback = Callable[[str, str], Awaitable[bool]]
"""(unit id, command) -> True to go ahead: a background unit's approval (see
``ToolContext.confirm_unit``)."""


class ApprovalExpired(Exception):
    """Raised by a confirmation hook when nobody answered before the approval's deadline:
    the command did not run, and nobody denied it either."""


@dataclass
class ToolContext:
    """Where a tool call comes from, so background work can find its way back there.

    ``before_background`` is awaited by a tool right before it starts work that outlives
    the turn (a detached delegation, a background process). A surface that writes a new
    session only when its first turn is stored uses it to write the session first, so a
    result can never arrive for an origin session its deliverer does not know.
    """

    session_id: str | None = None
    session_key: str | None = None
    origin_ui_session_id: str | None = None
    platform: str | None = None
    extra: JSONObject = field(default_factory=dict)
    before_background: Callable[[], Awaitable[None]] | None = None
    on_progress: ProgressCallback | None = None
    """Told when each tool call starts and ends, so a surface can show tool steps live."""
    confirm: ConfirmCallback | None = None
    """Asked before a tool does something a human must approve (a shell command); answers
    True to go ahead. None (every surface but the web UI today): no confirmation asked."""
    confirm_unit: UnitConfirmCallback | None = None
    """What work started in the background by this turn asks instead of ``confirm``, naming
    itself (a delegation id): it waits for a person on the conversation's surface without
    holding the session, and raises ApprovalExpired when nobody answered in time."""

    async def prepare_background(self) -> None:
        """Make the origin session durable before background work starts (see above)."""
        if self.before_background is not None:
            await self.before_background()

    def on_loop(self, loop: asyncio.AbstractEventLoop) -> ToolContext:
        """A copy for work that runs on another thread's event loop (a sub-agent): the same
        origin, and hooks that run on ``loop``, where the surface that made them lives (an
        approval waits on that server's store and futures). Progress stays with the turn
        that asked, so the copy reports none."""
        return replace(
            self,
            extra=dict(self.extra),
            before_background=_background_on_loop(self.before_background, loop),
            on_progress=None,
            confirm=_confirm_on_loop(self.confirm, loop),
            confirm_unit=_confirm_on_loop(self.confirm_unit, loop),
        )


class _OnLoop:
    """A hook of a surface, callable from any thread's loop: it runs on ``loop``, its own.

    Already bound to its loop, it stays so when handed further down (a sub-agent's own
    sub-agent), so a hook never depends on an intermediate loop that may have ended."""

    def __init__(self, hook: Callable[..., Awaitable[Any]], loop: asyncio.AbstractEventLoop):
        self.hook = hook
        self.loop = loop

    async def _there(self, *args: Any) -> Any:
        return await self.hook(*args)

    async def __call__(self, *args: Any) -> Any:
        call = self._there(*args)
        try:
            running = asyncio.run_coroutine_threadsafe(call, self.loop)
        except RuntimeError:  # the loop is closed
            call.close()
            raise
        # Cancelling the wait (a stalled sub-agent) cancels the call on ``loop`` too; an
        # approval withdrawn that way is denied there.
        return await asyncio.wrap_future(running)


class _ConfirmOnLoop(_OnLoop):
    """A confirmation hook on its loop; once that loop is gone (its server stopped) nobody
    can answer, so the command is denied."""

    async def __call__(self, *args: Any) -> bool:
        try:
            return bool(await super().__call__(*args))
        except RuntimeError:
            if not self.loop.is_closed():
                raise
            logger.warning("a command asked for approval after its server stopped: denied")
            return False


def _background_on_loop(
    hook: Callable[[], Awaitable[None]] | None, loop: asyncio.AbstractEventLoop
) -> Callable[[], Awaitable[None]] | None:
    if hook is None or isinstance(hook, _OnLoop):
        return hook
    return _OnLoop(hook, loop)


def _confirm_on_loop(
    confirm: Callable[..., Awaitable[bool]] | None, loop: asyncio.AbstractEventLoop
) -> Any:
    if confirm is None or isinstance(confirm, _OnLoop):
        return confirm
    return _ConfirmOnLoop(confirm, loop)


ToolHandler = Callable[[JSONObject, ToolContext], Awaitable["str | JSONObject"]]
"""(the arguments object the model sent, where the call comes from) -> the result: text,
or a JSON object the registry writes out."""


@dataclass
class Tool:
    """A callable tool: `parameters` is the JSON schema of its arguments object."""

    name: str
    description: str
    parameters: JSONObject
    handler: ToolHandler
    toolset: str | None = None
    """The group a delegation names to hand this tool to a sub-agent; None: its own name."""

    @property
    def toolset_name(self) -> str:
        return self.toolset or self.name

    def schema(self) -> ToolSchema:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


def tool_error(message: str) -> str:
    return json.dumps({"error": message}, ensure_ascii=False)


def _missing_required(tool: Tool, args: JSONObject) -> list[str]:
    required = tool.parameters.get("required")
    if not isinstance(required, list):
        return []
    return [key for key in required if isinstance(key, str) and args.get(key) is None]


class ToolRegistry:
    """Named tools, their schemas for the model, and safe dispatch of calls."""

    def __init__(self, tools: list[Tool] | None = None) -> None:
        self._tools: dict[str, Tool] = {}
        self._schemas: list[ToolSchema] | None = None
        for tool in tools or []:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"a tool named {tool.name!r} is already registered")
        self._tools[tool.name] = tool
        self._schemas = None

    def replace_toolset(self, toolset: str, tools: list[Tool]) -> None:
        """Put ``tools`` in place of the tools of ``toolset`` (a tool source whose list
        changed: an MCP server's ``tools/list_changed``); the others stay as they are."""
        kept = {n: t for n, t in self._tools.items() if t.toolset_name != toolset}
        clash = [tool.name for tool in tools if tool.name in kept]
        if clash:
            raise ValueError(f"tool name(s) already registered: {', '.join(clash)}")
        # One assignment: a reader on another thread sees the old set or the new one.
        self._tools = {**kept, **{tool.name: tool for tool in tools}}
        self._schemas = None

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return list(self._tools)

    def tools(self) -> list[Tool]:
        return list(self._tools.values())

    def toolsets(self) -> dict[str, list[str]]:
        """Toolset name -> the names of its tools, in the order they were registered."""
        groups: dict[str, list[str]] = {}
        for tool in self._tools.values():
            groups.setdefault(tool.toolset_name, []).append(tool.name)
        return groups

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def schemas(self) -> list[ToolSchema]:
        """The tools in the chat-completions `tools` request format."""
        # Asked for on every model call; rebuilt only when the registry changes.
        if self._schemas is None:
            self._schemas = [tool.schema() for tool in self._tools.values()]
        return list(self._schemas)

    async def call(
        self, name: str, arguments_json: str, ctx: ToolContext, call_id: str = ""
    ) -> str:
        """Run one tool call; the result text for the model, an error text on any failure.

        ``ctx.on_progress`` hears of the call when it starts and when it ends.
        """
        # One span per call (a no-op until an SDK is configured): the tool's name and
        # whether it failed, never its arguments or result.
        attributes = {"reveille.tool": name[:200], "reveille.session_id": ctx.session_id or ""}
        with trace.get_tracer("reveille").start_as_current_span(
            "reveille.tool", attributes=attributes, record_exception=False
        ) as span:
            result = await self._reported_call(name, arguments_json, ctx, call_id)
            span.set_attribute("reveille.outcome", "error" if _failed(result) else "ok")
            return result

    async def _reported_call(
        self, name: str, arguments_json: str, ctx: ToolContext, call_id: str
    ) -> str:
        if ctx.on_progress is None:
            return await self._call(name, arguments_json, ctx)
        started = time.monotonic()
        await _tell(ctx.on_progress, ToolProgress(call_id, name, "started"))
        result = await self._call(name, arguments_json, ctx)
        ok = not _failed(result)
        seconds = round(time.monotonic() - started, 3)
        await _tell(ctx.on_progress, ToolProgress(call_id, name, "finished", ok, seconds))
        return result

    async def _call(self, name: str, arguments_json: str, ctx: ToolContext) -> str:
        tool = self._tools.get(name)
        if tool is None:
            known = ", ".join(sorted(self._tools)) or "none"
            return tool_error(f"unknown tool {name!r}; available tools: {known}")
        # Models send "" (or nothing) for a call without arguments.
        raw = (arguments_json or "").strip() or "{}"
        try:
            args = json.loads(raw)
        except json.JSONDecodeError as exc:
            return tool_error(f"arguments for {name} are not valid JSON: {exc}")
        if not isinstance(args, dict):
            return tool_error(f"arguments for {name} must be a JSON object")
        missing = _missing_required(tool, args)
        if missing:
            return tool_error(f"{name} is missing required argument(s): {', '.join(missing)}")
        try:
            result = await tool.handler(args, ctx)
        except Exception as exc:
            # Logged here with its traceback; the model only gets a one-line reason.
            logger.exception("tool %s failed", name)
            return tool_error(f"{name} failed: {type(exc).__name__}: {exc}")
        if isinstance(result, str):
            return result
        return json.dumps(result, ensure_ascii=False, default=str)


def _failed(result: str) -> bool:
    return result.startswith('{"error"')


async def _tell(callback: ProgressCallback, progress: ToolProgress) -> None:
    # Progress is for show: a failing listener must not fail the tool call.
    try:
        await callback(progress)
    except Exception:
        logger.exception("tool progress listener failed")


@dataclass(frozen=True)
class ClientTool:
    """A function tool the client defined and runs itself: the model may call it, and the
    turn then stops and hands the call back to the client (``agent.loop``).

    ``model_name`` is the name the model sees: the client's own ``name`` unless that
    collides with a server tool, then ``client__<name>`` (mapped back for the client).
    """

    name: str
    model_name: str
    description: str = ""
    parameters: JSONObject = field(default_factory=dict)
    strict: bool | None = None

    def schema(self) -> ToolSchema:
        function: dict[str, Any] = {"name": self.model_name, "parameters": self.parameters}
        if self.description:
            function["description"] = self.description
        if self.strict is not None:
            function["strict"] = self.strict
        return {"type": "function", "function": function}  # type: ignore[typeddict-item]


@dataclass(frozen=True)
class ToolOffer:
    """Which tools one turn offers the model: the server's own (unless ``server_tools`` is
    off) beside the client's, narrowed to ``allowed`` (model names) when that is set."""

    client: tuple[ClientTool, ...] = ()
    server_tools: bool = True
    allowed: frozenset[str] | None = None

    def client_tool(self, model_name: str) -> ClientTool | None:
        return next((tool for tool in self.client if tool.model_name == model_name), None)

    def shown(self, call: ToolCall) -> ToolCall:
        """``call`` as the client sees it: in the client's own name for its tool."""
        tool = self.client_tool(call["function"]["name"])
        if tool is None:
            return call
        return {**call, "function": {**call["function"], "name": tool.name}}

    def offers(self, model_name: str) -> bool:
        return self.allowed is None or model_name in self.allowed

    def schemas(self, registry: ToolRegistry) -> list[ToolSchema]:
        server = registry.schemas() if self.server_tools else []
        every = [*server, *(tool.schema() for tool in self.client)]
        return [schema for schema in every if self.offers(schema["function"].get("name", ""))]


CLIENT_PREFIX = "client__"


def client_model_name(name: str, server_names: Collection[str]) -> str:
    """The name a client tool is offered under: its own, or namespaced when a server tool
    (or another name already taken) has it."""
    return f"{CLIENT_PREFIX}{name}" if name in server_names else name


@dataclass(frozen=True)
class ToolOutput:
    """A client's result for one of its tool calls (a chat ``role: "tool"`` message, a
    Responses ``function_call_output`` item)."""

    call_id: str
    output: str
