"""The `delegate_task` tool: hands a goal to a sub-agent, inline or in the background.

Inline, the turn waits for the sub-agent's summary. In the background the work goes through
`tools.async_delegation`, which records it durably and later delivers the result back to
the session that asked; the tool itself returns a handle at once.

A sub-agent gets the toolsets its dispatch names, or by default every toolset of the agent
that dispatched it except ``delegation``; it runs its own tool loop under
``DelegationLimits`` (steps, stall time, depth: a sub-agent at ``max_depth`` never gets
``delegate_task``, so fan-out is bounded). Its tool calls come from the dispatching turn's
origin and ask, on the dispatching server's event loop: an inline sub-agent that turn's
confirmation hook, a background one the turn's ``confirm_unit`` naming its delegation, so
its approvals hold no session, outlive the turn and expire on their own deadline.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, replace

from agent.messages import JSONObject
from agent.providers.base import ModelProvider
from agent.subagent import StopSignal, SubagentOutcome, run_subagent_sync
from agent.tool_args import as_bool, as_optional_str, as_str_list
from agent.tools import Tool, ToolContext, ToolRegistry
from tools.wakeup_tool import WAKEUP_TOOLSET

DELEGATION_TOOLSET = "delegation"
# Toolsets a sub-agent gets only when its dispatch names them.
_ONLY_WHEN_NAMED = frozenset({DELEGATION_TOOLSET, WAKEUP_TOOLSET})

PARAMETERS: JSONObject = {
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
            "description": "Toolsets the sub-agent may use, by toolset or tool name (e.g. "
            '["terminal"]). Default: all of your tools except delegate_task and '
            "schedule_wakeup.",
        },
        "role": {"type": "string", "description": "A role for the sub-agent, e.g. 'researcher'."},
    },
    "required": ["goal"],
}

DESCRIPTION = (
    "Delegate a goal to a sub-agent, which works on it with its own tools. By default waits "
    "for its result; with background=true returns a handle (delegation_id) at once and the "
    "result arrives in this conversation later."
)


@dataclass(frozen=True)
class DelegationLimits:
    """How far sub-agents may go: ``max_depth`` levels of delegation (1: sub-agents cannot
    delegate further), ``max_steps`` model calls each, and ``stall_seconds`` without any
    progress (no model answer, or one tool still running) before one is stopped."""

    max_depth: int = 1
    max_steps: int = 20
    stall_seconds: float = 300.0

    def __post_init__(self) -> None:
        if self.max_depth < 1:
            raise ValueError("max_depth must be at least 1")
        if self.max_steps < 1:
            raise ValueError("max_steps must be at least 1")
        if self.stall_seconds <= 0:
            raise ValueError("stall_seconds must be positive")


class ToolsetError(ValueError):
    """A dispatch named toolsets its sub-agent cannot have; the message says which and why."""


def subagent_toolsets(
    parent: ToolRegistry, requested: list[str] | None, *, may_delegate: bool
) -> list[str]:
    """The toolsets a sub-agent gets: those ``requested`` (a toolset's name or one of its
    tools' names), or by default all of ``parent``'s but ``delegation`` and ``timers`` (a
    wake-up outlives the sub-agent: it is set only when the dispatch asks for it).
    ToolsetError for an unknown name, or for ``delegation`` when the sub-agent would be at
    the depth limit."""
    groups = parent.toolsets()
    if requested is None:
        return [name for name in groups if name not in _ONLY_WHEN_NAMED]
    by_tool = {tool.name: tool.toolset_name for tool in parent.tools()}
    chosen: list[str] = []
    unknown: list[str] = []
    for name in requested:
        toolset = name if name in groups else by_tool.get(name)
        if toolset is None:
            unknown.append(name)
        elif toolset not in chosen:
            chosen.append(toolset)
    offered = [name for name in groups if may_delegate or name != DELEGATION_TOOLSET]
    if unknown:
        raise ToolsetError(
            f"unknown toolset(s): {', '.join(repr(n) for n in unknown)}; available: "
            f"{', '.join(offered) or 'none'}"
        )
    if DELEGATION_TOOLSET in chosen and not may_delegate:
        raise ToolsetError(
            f"the toolset {DELEGATION_TOOLSET!r} is not available here: a sub-agent at the "
            "delegation depth limit cannot delegate further (setting [delegation] max_depth)"
        )
    return chosen


def make_delegate_tool(
    provider: ModelProvider,
    *,
    max_async_children: int = 3,
    limits: DelegationLimits | None = None,
    parent_tools: Callable[[], ToolRegistry] | None = None,
    depth: int = 0,
) -> Tool:
    """`delegate_task` for an agent at ``depth`` (0: a conversation's own agent), whose
    sub-agents run on ``provider`` with toolsets of ``parent_tools()`` (the registry this
    tool belongs to; None: sub-agents get no tools)."""
    limits = limits or DelegationLimits()

    def tools_of(parent: ToolRegistry, toolsets: list[str]) -> ToolRegistry:
        """The sub-agent's registry: ``parent``'s tools of ``toolsets``, with a
        ``delegate_task`` one level deeper in place of this one."""
        registry = ToolRegistry()
        for tool in parent.tools():
            if tool.toolset_name not in toolsets:
                continue
            if tool.toolset_name == DELEGATION_TOOLSET:
                tool = make_delegate_tool(
                    provider,
                    max_async_children=max_async_children,
                    limits=limits,
                    parent_tools=lambda: registry,
                    depth=depth + 1,
                )
            registry.register(tool)
        return registry

    async def handler(args: JSONObject, ctx: ToolContext) -> str | JSONObject:
        goal = str(args.get("goal") or "").strip()
        if not goal:
            return {"error": "goal must not be empty"}
        context = as_optional_str(args.get("context"))
        parent = parent_tools() if parent_tools is not None else ToolRegistry()
        try:
            # The sub-agent is one level below this agent; at the limit it gets no
            # delegate_task, so fan-out stays bounded.
            toolsets = subagent_toolsets(
                parent,
                as_str_list(args.get("toolsets")),
                may_delegate=depth + 1 < limits.max_depth,
            )
        except ToolsetError as exc:
            return {"error": str(exc)}
        tools = tools_of(parent, toolsets)
        background = as_bool(args.get("background"))
        unit = _UnitName() if background and ctx.confirm_unit is not None else None
        # The sub-agent runs on a worker thread with a loop of its own; its hooks (the
        # approval of a command) run on this loop, where the surface that made them lives.
        sub_ctx = (unit.context(ctx) if unit is not None else ctx).on_loop(
            asyncio.get_running_loop()
        )
        stop = StopSignal()

        def run() -> SubagentOutcome:
            # Lazy like the dispatch below; a no-op for an inline run (no unit on its thread).
            from tools.delegation_runtime import report_progress

            return run_subagent_sync(
                provider,
                goal,
                context,
                tools=tools,
                ctx=sub_ctx,
                max_steps=limits.max_steps,
                stall_seconds=limits.stall_seconds,
                stop=stop,
                approvals_bounded=unit is not None,
                progress=report_progress,
            )

        if not background:
            # A worker thread, not the loop: the sub-agent runs its own event loop.
            try:
                outcome = await asyncio.to_thread(run)
            except asyncio.CancelledError:
                stop()  # the turn was stopped: so is the sub-agent it waits for
                raise
            if outcome.get("status") == "completed":
                return str(outcome.get("summary", ""))
            failure: JSONObject = {"error": _failure(outcome)}
            if outcome.get("summary"):
                failure["partial_result"] = str(outcome["summary"])
            return failure

        await ctx.prepare_background()  # its origin session is written before any result
        # Lazy: the delivery machinery is only needed once something goes to the background.
        from tools.async_delegation import dispatch_async_delegation

        # Dispatch writes the durable ledger row before returning, so it must not block
        # the event loop.
        dispatched = await asyncio.to_thread(
            lambda: dispatch_async_delegation(
                goal=goal,
                context=context,
                toolsets=toolsets,
                role=as_optional_str(args.get("role")),
                model=provider.name,
                session_key=ctx.session_key,
                origin_session_id=ctx.session_id,
                origin_ui_session_id=ctx.origin_ui_session_id,
                runner=lambda: dict(run()),
                interrupt_fn=stop,  # a cancel, or a server that stops, stops it
                max_async_children=max_async_children,
            )
        )
        if unit is not None and dispatched.get("delegation_id"):
            unit.named(str(dispatched["delegation_id"]))
        return json.loads(json.dumps(dispatched, default=str))

    return Tool(
        name="delegate_task",
        description=DESCRIPTION,
        parameters=PARAMETERS,
        handler=handler,
        toolset=DELEGATION_TOOLSET,
    )


class _UnitName:
    """The delegation id of a background sub-agent, known once its dispatch returned; its
    approvals (asked on the dispatching loop, maybe before that) wait for it, so each
    names the unit that asked."""

    def __init__(self) -> None:
        self._id: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def named(self, delegation_id: str) -> None:
        if not self._id.done():
            self._id.set_result(delegation_id)

    def context(self, ctx: ToolContext) -> ToolContext:
        """``ctx`` whose ``confirm`` asks as this unit (``ctx.confirm_unit``)."""
        confirm_unit = ctx.confirm_unit
        assert confirm_unit is not None

        async def confirm(command: str) -> bool:
            return await confirm_unit(await asyncio.shield(self._id), command)

        return replace(ctx, confirm=confirm)


def _failure(outcome: SubagentOutcome) -> str:
    error = str(outcome.get("error") or "unknown error")
    # A stall's error already tells its story ("the sub-agent stalled: ...").
    return error if outcome.get("status") == "stalled" else f"the sub-agent failed: {error}"
