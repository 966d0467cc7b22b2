"""The tool-calling agent loop (the synchronous sub-agent entry point is in ``agent.subagent``).

One turn: ask the model (offering the registry's tools, and the client's own function tools
when the turn has a ``ToolOffer``); while it answers with tool calls, run them and feed the
results back; stop at a plain answer, at the step limit, or at a call of a client tool: the
server's calls of that step run first, the client's come back as ``pending_calls`` for the
client to run (the turn is resumed with their results, see ``gateway.turns.client_calls``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TypedDict

from agent.markers import SUBAGENT_MARKER
from agent.messages import ChatMessage, ToolCall
from agent.providers.base import (
    DeltaCallback,
    ModelOptions,
    ModelProvider,
    ModelReply,
    add_usage,
    empty_usage,
)
from agent.tools import ToolContext, ToolOffer, ToolRegistry, tool_error

SUBAGENT_SYSTEM_PROMPT = (
    f"{SUBAGENT_MARKER}\n"
    "You are a sub-agent working on one delegated goal. Work on it with the tools you have, "
    "then reply with a self-contained result: the person reading it has not seen your work."
)


@dataclass
class AgentResult:
    """The outcome of one turn; `new_messages` is what the turn adds to the transcript."""

    content: str
    new_messages: list[ChatMessage] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=empty_usage)
    steps: int = 0
    step_limit_reached: bool = False
    # Why the model stopped its last answer (chat's finish_reason): "length" is a cut.
    finish_reason: str = "stop"
    pending_calls: list[ToolCall] = field(default_factory=list)
    """Calls of client tools (model names) the client must run before the turn goes on;
    ``new_messages`` then ends with that step's assistant message and the server's results."""


def step_limit_message(max_steps: int) -> str:
    return (
        f"I stopped after {max_steps} steps without reaching a final answer "
        "(the step limit). Ask me to continue if you want me to keep going."
    )


class _LiveText:
    """Passes every step's text to the caller as it arrives, and keeps what was shown.

    Text a model writes before it calls a tool ("let me check that") is part of what the
    user sees, live; the turn's answer is all of it, steps apart by a blank line, so the
    streamed answer and the stored one are the same text.
    """

    def __init__(self, on_delta: DeltaCallback | None) -> None:
        self._on_delta = on_delta
        self._steps: list[str] = []
        self._current: list[str] = []

    async def __call__(self, piece: str) -> None:
        if not piece:
            return
        if not self._current and self._steps:
            piece = "\n\n" + piece
        self._current.append(piece)
        if self._on_delta is not None:
            await self._on_delta(piece)

    async def end_step(self, content: str | None) -> None:
        """Close a step; a provider that did not stream its text is shown it now."""
        if not self._current and content:
            await self(content)
        if self._current:
            self._steps.append("".join(self._current))
            self._current = []

    @property
    def text(self) -> str:
        return "".join(self._steps)


class Agent:
    """Runs turns of `provider` with the tools of `registry`."""

    def __init__(
        self,
        provider: ModelProvider,
        registry: ToolRegistry,
        *,
        max_steps: int = 8,
        system_prompt: str | None = None,
    ) -> None:
        if max_steps < 1:
            raise ValueError("max_steps must be at least 1")
        self.provider = provider
        self.registry = registry
        self.max_steps = max_steps
        self.system_prompt = system_prompt

    def _with_system_prompt(self, messages: list[ChatMessage]) -> list[ChatMessage]:
        if not self.system_prompt:
            return list(messages)
        # Merged into a leading system message rather than stacked: some local chat
        # templates (llama.cpp, Ollama) reject a second system message.
        if messages and messages[0].get("role") == "system":
            first = messages[0].copy()
            first["content"] = f"{self.system_prompt}\n\n{first.get('content') or ''}"
            return [first, *messages[1:]]
        return [{"role": "system", "content": self.system_prompt}, *messages]

    async def run(
        self,
        messages: list[ChatMessage],
        ctx: ToolContext,
        *,
        on_delta: DeltaCallback | None = None,
        options: ModelOptions | None = None,
        offer: ToolOffer | None = None,
    ) -> AgentResult:
        """One turn; ``options`` (the client's generation options) go to every model call,
        except that ``tool_choice="required"`` (or a named tool) holds for the first call
        only. ``offer``: the client's tools beside (or instead of) the server's."""
        conversation = self._with_system_prompt(messages)
        new_messages: list[ChatMessage] = []
        usage = empty_usage()
        tools = (offer.schemas(self.registry) if offer else self.registry.schemas()) or None

        live = _LiveText(on_delta)
        for step in range(1, self.max_steps + 1):
            step_options = options
            if step > 1 and options is not None and _forcing(options.tool_choice):
                step_options = replace(options, tool_choice="auto")
            # Every step streams live, the text before a tool call too (see _LiveText). The
            # provider is awaited here, not in a method around it: each resumption while it
            # answers would pass through that frame too.
            extra = complete_keywords(live if on_delta else None, step_options or None)
            reply = await self.provider.complete(conversation, tools=tools, **extra)
            add_usage(usage, reply.usage)
            await live.end_step(reply.content)
            if not reply.tool_calls:
                final: ChatMessage = {"role": "assistant", "content": reply.content or ""}
                new_messages.append(final)
                reason = reply.finish_reason or "stop"
                return AgentResult(live.text, new_messages, usage, step, finish_reason=reason)
            step_messages, pending = await self._run_tool_calls(reply, ctx, offer)
            conversation.extend(step_messages)
            new_messages.extend(step_messages)
            if pending:
                return AgentResult(live.text, new_messages, usage, step, pending_calls=pending)

        await live.end_step(step_limit_message(self.max_steps))
        new_messages.append({"role": "assistant", "content": step_limit_message(self.max_steps)})
        return AgentResult(live.text, new_messages, usage, self.max_steps, step_limit_reached=True)

    async def _run_tool_calls(
        self, reply: ModelReply, ctx: ToolContext, offer: ToolOffer | None = None
    ) -> tuple[list[ChatMessage], list[ToolCall]]:
        """The step's messages (the call, the server's results) and the client's calls."""
        calls = [_normalised_call(index, call) for index, call in enumerate(reply.tool_calls)]
        messages: list[ChatMessage] = [
            {"role": "assistant", "content": reply.content, "tool_calls": calls}
        ]
        pending: list[ToolCall] = []
        # One after another, in the model's order: a later call may depend on an earlier one.
        for call in calls:
            function = call["function"]
            name = function["name"]
            if offer is not None and offer.client_tool(name) is not None and offer.offers(name):
                pending.append(call)  # the client runs it; the turn stops after this step
                continue
            if offer is not None and not (offer.server_tools and offer.offers(name)):
                result = tool_error(f"unknown tool {name!r}: it is not offered in this turn")
            else:
                result = await self.registry.call(name, function["arguments"], ctx, call["id"])
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        return messages, pending


class CompleteKeywords(TypedDict, total=False):
    """The optional keywords of ``ModelProvider.complete``, passed only when set."""

    on_delta: DeltaCallback
    options: ModelOptions


def complete_keywords(
    on_delta: DeltaCallback | None, options: ModelOptions | None
) -> CompleteKeywords:
    """The optional keywords of ``ModelProvider.complete`` that are set: they go only when
    set, so providers written before them still work."""
    extra: CompleteKeywords = {}
    if on_delta is not None:
        extra["on_delta"] = on_delta
    if options:
        extra["options"] = options
    return extra


def _forcing(tool_choice: object) -> bool:
    """A tool choice that forces a call (``required`` or a named tool): for one step only."""
    return tool_choice == "required" or isinstance(tool_choice, Mapping)


def _normalised_call(index: int, call: Mapping[str, object]) -> ToolCall:
    """A tool call in the exact OpenAI shape, whatever liberties the provider took."""
    function = call.get("function")
    if not isinstance(function, Mapping):
        function = {}
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments if arguments is not None else {})
    call_id = call.get("id")
    name = function.get("name")
    return {
        "id": call_id if isinstance(call_id, str) and call_id else f"call_{index}",
        "type": "function",
        "function": {"name": name if isinstance(name, str) else "", "arguments": arguments},
    }


def subagent_messages(goal: str, context: str | None) -> list[ChatMessage]:
    task = f"Goal: {goal}"
    if context:
        task += f"\n\nContext:\n{context}"
    return [
        {"role": "system", "content": SUBAGENT_SYSTEM_PROMPT},
        {"role": "user", "content": task},
    ]
