"""A sub-agent's run: its own tool loop on a worker thread, watched for stalls, and the
result it hands back, which says what it had when it stopped and which tools it used.

``run_subagent`` is what a delegation's runner calls on a worker thread (there is no event
loop there: it runs its own). A run ends

- ``completed``: the model answered without calling a tool, or the step limit was reached
  (``step_limit_reached``; the summary is what it had and says that it stopped there);
- ``stalled``: nothing moved for ``stall_seconds``: no model answer, or one tool still
  running (an approval that tool waits for counts as the tool running, except a
  background unit's: ``approvals_bounded``, its own deadline bounds that wait). The run is
  cancelled (a running command is killed) and the summary is what it had;
- ``failed``: a model call failed; the summary is what it had, if anything;
- ``interrupted``: it was told to stop (``StopSignal``: a cancel, a server that stops, the
  turn that waits for an inline one was stopped); a running command is killed.

The result (``status``, ``summary``/``error``) is the runner result of the delivery contract;
``tools_used`` (``[{"name", "calls"}]``, in the order first used) is there whenever the
sub-agent was given tools, so a reader can tell work done from a guess.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypedDict

from agent.loop import Agent, AgentResult, complete_keywords, subagent_messages
from agent.messages import ChatMessage, ToolSchema
from agent.providers.base import DeltaCallback, ModelOptions, ModelProvider, ModelReply
from agent.tools import ConfirmCallback, ToolContext, ToolRegistry

# What a stopped run reports of its tool calls: bounded, so a chatty tool cannot make the
# result (and the wake-up that carries it) huge.
_SHOWN_CALLS = 20
_ARGUMENTS_CHARS = 300
_RESULT_CHARS = 2000
# How long a cancelled run gets to unwind (kill its command, close its model call).
_CANCEL_GRACE_SECONDS = 5.0
_STOPPED = object()  # what a run told to stop ends with


class ToolCount(TypedDict):
    """How often a sub-agent called one of its tools."""

    name: str
    calls: int


class SubagentOutcome(TypedDict, total=False):
    """What ``run_subagent`` returns: the runner result a delegation records."""

    status: str  # "completed", "failed", "interrupted" or "stalled"
    summary: str
    error: str
    step_limit_reached: bool
    tools_used: list[ToolCount]


@dataclass
class ToolUse:
    """One tool call of a sub-agent; ``result`` is None while it runs."""

    name: str
    arguments: str
    result: str | None = None


ProgressReport = Callable[[str, str | None], None]
"""Told each step of a run (what it is doing, and its last output line when it has one)."""


class _Watch:
    """What the run did so far, and when it last moved."""

    def __init__(self, report: ProgressReport | None = None) -> None:
        self.report = report
        self.moved = time.monotonic()
        self.doing = "waiting for the model"
        self.texts: list[str] = []
        self.calls: list[ToolUse] = []
        self.known_tools: frozenset[str] = frozenset()
        self.asking = 0  # approvals being waited for that do not count as standing still

    def move(self, doing: str, output: str | None = None) -> None:
        self.moved = time.monotonic()
        self.doing = doing
        if self.report is not None:
            with contextlib.suppress(Exception):  # a report never stops the run
                self.report(doing, output)

    def tools_used(self) -> list[ToolCount]:
        counts: dict[str, int] = {}
        for call in self.calls:
            # A call to a tool it was not given is an error the model read, not a use.
            if call.name in self.known_tools:
                counts[call.name] = counts.get(call.name, 0) + 1
        return [{"name": name, "calls": calls} for name, calls in counts.items()]

    def so_far(self) -> str:
        """What the run had: the text the model wrote, and its tool calls with results."""
        parts = [text.strip() for text in self.texts if text.strip()]
        if self.calls:
            lines = [f"Tool calls so far ({len(self.calls)}):"]
            hidden = len(self.calls) - _SHOWN_CALLS
            if hidden > 0:
                lines.append(f"({hidden} earlier call(s) not shown)")
            for index, call in enumerate(self.calls[-_SHOWN_CALLS:], max(hidden, 0) + 1):
                result = (
                    "(still running when it stopped)"
                    if call.result is None
                    else _clip(call.result, _RESULT_CHARS)
                )
                arguments = _clip(call.arguments, _ARGUMENTS_CHARS)
                lines.append(f"{index}. {call.name} {arguments} -> {result}")
            parts.append("\n".join(lines))
        return "\n\n".join(parts)


def _clip(text: str, limit: int) -> str:
    text = text.strip()
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


class _WatchedProvider:
    """The sub-agent's provider: each answer is progress, and its text is kept."""

    def __init__(self, inner: ModelProvider, watch: _Watch) -> None:
        self.name = inner.name
        self._inner = inner
        self._watch = watch

    async def complete(
        self,
        messages: list[ChatMessage],
        *,
        tools: list[ToolSchema] | None = None,
        on_delta: DeltaCallback | None = None,
        options: ModelOptions | None = None,
    ) -> ModelReply:  # the ModelProvider protocol, passing keywords on only when set
        self._watch.move("waiting for the model")
        extra = complete_keywords(on_delta, options)
        reply = await self._inner.complete(messages, tools=tools, **extra)
        if reply.content:
            self._watch.texts.append(reply.content)
        self._watch.move("after the model answered", reply.content)
        return reply


class _WatchedRegistry(ToolRegistry):
    """The sub-agent's tools: each call is recorded, its start and end are progress."""

    def __init__(self, tools: ToolRegistry, watch: _Watch) -> None:
        super().__init__(tools.tools())
        self._watch = watch
        watch.known_tools = frozenset(tools.names())

    async def call(
        self, name: str, arguments_json: str, ctx: ToolContext, call_id: str = ""
    ) -> str:
        use = ToolUse(name, arguments_json or "")
        self._watch.calls.append(use)
        self._watch.move(f"running the tool {name}")
        use.result = await super().call(name, arguments_json, ctx, call_id)
        self._watch.move(f"after the tool {name}", use.result)
        return use.result


class StopSignal:
    """Stops a running sub-agent from any thread: a delegation's ``interrupt_fn``, or the
    turn that waits for an inline one. Calling it before the run started stops it at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._target: tuple[asyncio.AbstractEventLoop, asyncio.Future[Any]] | None = None
        self.requested = False

    def __call__(self) -> None:
        with self._lock:
            self.requested = True
            target = self._target
        if target is not None:
            _cancel_on(*target)

    def attach(self, loop: asyncio.AbstractEventLoop, run: asyncio.Future[Any]) -> None:
        with self._lock:
            self._target = (loop, run)
            requested = self.requested
        if requested:
            _cancel_on(loop, run)


def _cancel_on(loop: asyncio.AbstractEventLoop, run: asyncio.Future[Any]) -> None:
    with contextlib.suppress(RuntimeError):  # the run's loop has ended: nothing to stop
        loop.call_soon_threadsafe(run.cancel)


async def _until_done_or_stalled(
    run: asyncio.Future[AgentResult], watch: _Watch, stall_seconds: float | None
) -> AgentResult | None:
    """The run's result, or None once it stood still for ``stall_seconds`` (then cancelled)."""
    if stall_seconds is None:
        return await run
    while True:
        if watch.asking:
            watch.moved = time.monotonic()  # waiting for a person, under their own deadline
        left = watch.moved + stall_seconds - time.monotonic()
        if left <= 0:
            run.cancel()
            # A tool that ignores cancellation (blocking work on a thread) must not hold
            # the result back: what it had is reported anyway.
            await asyncio.wait({run}, timeout=_CANCEL_GRACE_SECONDS)
            if run.done() and not run.cancelled():
                run.exception()  # retrieved: it ended on its own; the stall stands
            return None
        await asyncio.wait({run}, timeout=left)
        if run.done():
            return run.result()


def _asking(confirm: ConfirmCallback, watch: _Watch) -> ConfirmCallback:
    """``confirm``, during whose wait the run does not stand still (see ``_Watch.asking``)."""

    async def ask(command: str) -> bool:
        watch.asking += 1
        try:
            return await confirm(command)
        finally:
            watch.asking -= 1
            watch.move(watch.doing)

    return ask


def run_subagent(
    provider: ModelProvider,
    goal: str,
    context: str | None,
    *,
    tools: ToolRegistry | None = None,
    ctx: ToolContext | None = None,
    max_steps: int = 8,
    stall_seconds: float | None = None,
    stop: StopSignal | None = None,
    approvals_bounded: bool = False,
    progress: ProgressReport | None = None,
) -> SubagentOutcome:
    """Run a sub-agent to its end on the calling thread (see the module docstring); never
    raises. ``ctx`` must be one whose hooks may be called from this thread
    (``ToolContext.on_loop``); ``stall_seconds`` None: no stall limit. With
    ``approvals_bounded`` (a background unit's approvals expire on their own) waiting for
    an approval is not standing still; ``progress`` is told each step."""
    watch = _Watch(progress)
    registry = tools if tools is not None else ToolRegistry()
    if approvals_bounded and ctx is not None and ctx.confirm is not None:
        ctx = replace(ctx, confirm=_asking(ctx.confirm, watch))

    async def main() -> AgentResult | object | None:
        agent = Agent(
            _WatchedProvider(provider, watch),
            _WatchedRegistry(registry, watch),
            max_steps=max_steps,
        )
        try:
            run = asyncio.ensure_future(
                agent.run(subagent_messages(goal, context), ctx or ToolContext())
            )
            if stop is not None:
                stop.attach(asyncio.get_running_loop(), run)
            try:
                return await _until_done_or_stalled(run, watch, stall_seconds)
            except asyncio.CancelledError:
                if stop is None or not stop.requested:
                    raise
                return _STOPPED
        finally:
            # Providers with per-loop resources (HTTP pools) release them before this
            # loop closes, or they would leak one pool per sub-agent.
            aclose = getattr(provider, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()

    try:
        result = asyncio.run(main())
    except Exception as exc:
        outcome = _with_what_it_had(
            {"status": "failed", "error": str(exc) or type(exc).__name__}, watch, "before it failed"
        )
    else:
        outcome = _outcome(result, watch, max_steps=max_steps, stall_seconds=stall_seconds)
    if len(registry):
        outcome["tools_used"] = watch.tools_used()
    return outcome


def _outcome(
    result: AgentResult | object | None,
    watch: _Watch,
    *,
    max_steps: int,
    stall_seconds: float | None,
) -> SubagentOutcome:
    if result is _STOPPED:
        return _with_what_it_had(
            {"status": "interrupted", "error": "the sub-agent was told to stop"},
            watch,
            "when it was stopped",
        )
    if not isinstance(result, AgentResult):
        error = (
            f"the sub-agent stalled: nothing moved for {stall_seconds or 0:g} s while "
            f"{watch.doing}, so it was stopped"
        )
        return _with_what_it_had({"status": "stalled", "error": error}, watch, "when it stalled")
    if result.step_limit_reached:
        return {
            "status": "completed",
            "summary": (
                f"The sub-agent stopped at its step limit ({max_steps} steps) before it "
                f"reached a final answer. What it had:\n\n{watch.so_far() or '(nothing yet)'}"
            ),
            "step_limit_reached": True,
        }
    return {"status": "completed", "summary": result.content}


def _with_what_it_had(outcome: SubagentOutcome, watch: _Watch, when: str) -> SubagentOutcome:
    if had := watch.so_far():
        outcome["summary"] = f"What the sub-agent had {when}:\n\n{had}"
    return outcome


def describe_tools_used(value: Any) -> str | None:
    """One short line for a reader ("Tools used: terminal (2 calls)"), from a result's
    ``tools_used``; None when it has none (the sub-agent was given no tools) or it is not
    in the shape ``run_subagent`` writes."""
    if not isinstance(value, list):
        return None
    parts = []
    for item in value:
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            return None
        calls = item.get("calls")
        count = calls if isinstance(calls, int) and not isinstance(calls, bool) else 0
        parts.append(f"{item['name']} ({count} call{'' if count == 1 else 's'})")
    return "Tools used: " + (", ".join(parts) if parts else "none")


def run_subagent_sync(
    provider: ModelProvider,
    goal: str,
    context: str | None,
    *,
    max_steps: int = 8,
    tools: ToolRegistry | None = None,
    ctx: ToolContext | None = None,
    stall_seconds: float | None = None,
    stop: StopSignal | None = None,
    approvals_bounded: bool = False,
    progress: ProgressReport | None = None,
) -> SubagentOutcome:
    """Run a sub-agent to completion on the calling thread; never raises.

    Meant for worker threads, which have no event loop: it starts its own. With ``tools``
    it runs its own tool loop, watched for stalls: see ``run_subagent``.
    """
    return run_subagent(
        provider,
        goal,
        context,
        tools=tools,
        ctx=ctx,
        max_steps=max_steps,
        stall_seconds=stall_seconds,
        stop=stop,
        approvals_bounded=approvals_bounded,
        progress=progress,
    )
