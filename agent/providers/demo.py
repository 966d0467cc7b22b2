"""The built-in offline demo model: a scripted stand-in that exercises Reveille without network.

It is NOT a language model. It follows fixed rules so the whole system (tool calls,
background delegation, background shell processes, wake-ups) can be tried and tested offline.
"""

from __future__ import annotations

import asyncio
import json
import re

from agent.markers import SUBAGENT_MARKER, SUMMARISE_MARKER
from agent.messages import ChatMessage, JSONObject, ToolCall, ToolSchema
from agent.providers.base import DeltaCallback, ModelOptions, ModelReply
from agent.providers.demo_summaries import (
    first_lines,
    is_completion_text,
    summarise_completion_text,
)

DELEGATE_PREFIX = "in the background:"
SHELL_PREFIX = "run in the background:"
DELEGATE_TOOL = "delegate_task"
SHELL_TOOL = "terminal"
WAKEUP_TOOL = "schedule_wakeup"
SCHEDULE_TOOL = "schedule"
_EVERY = re.compile(r"^\s*every\s+(\d{1,9})\s+seconds?\s*:\s*(.*)$", re.I | re.S)
_CALL = re.compile(r"^\s*call\s+([A-Za-z0-9_:.-]+)\s+with\s+(\{.*\})\s*$", re.I | re.S)
# "call client tool <name> with <JSON>": a tool the client defined (offered as
# ``client__<name>`` when a server tool has its name).
_CLIENT_CALL = re.compile(
    r"^\s*call\s+client\s+tool\s+([A-Za-z0-9_:.-]+)\s+with\s+(\{.*\})\s*$", re.I | re.S
)
_REMIND = re.compile(r"^\s*remind me in\s+(\d{1,9})\s+seconds?\s*:\s*(.*)$", re.I | re.S)
_SNIPPET_CHARS = 200


def _text(message: ChatMessage) -> str:
    """The text of a message, including the multi-part content form clients may send."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def _demo_summary(messages: list[ChatMessage]) -> str:
    """A compaction summary (``gateway.turns.compaction``): what the user asked, in short. The
    list of finished background work is added by the compaction itself."""
    text = _text(messages[-1]) if messages else ""
    asked = [
        line[len("user:") :].strip()[:80]
        for line in text.splitlines()
        if line.startswith("user:") and line[len("user:") :].strip()
    ]
    results = sum(1 for line in text.splitlines() if line.startswith("background result"))
    lines = ["Demo summary of earlier messages."]
    if asked:
        lines.append("The user asked: " + "; ".join(asked[-8:]) + ".")
    if results:
        lines.append(f"{results} background result(s) arrived and were read.")
    return " ".join(lines)


IMAGE_NOTE = "I cannot see images: the demo model reads only the text of a message."


def _has_images(message: ChatMessage) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(part, dict) and part.get("type") == "image_url" for part in content
    )


def _current_turn(messages: list[ChatMessage]) -> list[ChatMessage]:
    """The messages since the last final answer: earlier turns were already answered."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.get("role") == "assistant" and not message.get("tool_calls"):
            return messages[index + 1 :]
    return messages


def _json_or_none(text: str) -> JSONObject | None:
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


class DemoModel:
    """Reveille's offline demo model. A demo, not a language model: its replies are scripted.

    Deterministic rules, same input -> same output:

    * Sub-agent run (a system message contains "[reveille:subagent]"): waits
      `delay_seconds`, then answers "Done: <goal>. (demo sub-agent result)".
    * The latest user message starts with "run in the background:" (any case): calls the
      `terminal` tool with {"command": <rest>, "background": true,
      "notify_on_complete": true}; once the tool answers, says what happened (started,
      or why not, e.g. the shell tool is disabled).
    * It is "call client tool <name> with <JSON>": calls that client-defined tool (offered
      as `client__<name>` when a server tool has its name); after the client's result it
      answers with it, as after any tool.
    * It starts with "in the background:": calls `delegate_task` with
      {"goal": <rest>, "background": true}; once the tool answers, says the work was started
      and quotes its handle (the delegation_id).
    * It is "remind me in <N> seconds: <text>": calls `schedule_wakeup` with
      {"in_seconds": N, "note": <text>}; once the tool answers, says when it is due (or
      why not). The wake-up, when it fires, is summarised as "Reminder: <text>".
    * It is "every <N> seconds: <text>": calls `schedule` with {"action": "create",
      "every_seconds": N, "note": <text>}; each occurrence is summarised like a reminder.
    * The current turn holds a wake-up ("[reveille:wake]") or folded delivered results
      ("[reveille:delivery]"): summarises each as "Background work finished: <goal>:
      <status>. Result: <summary or first lines of output>".
    * Anything else: a short plain reply that says it is the demo model and how to start
      background work.

    A command whose tool is not on offer gets a plain reply saying so. When a turn holds
    both delivered results and a command, the final answer gives the summaries first.
    Replies stream word by word to `on_delta`; token usage is counted in words. The model
    name reported to clients and recorded with delegations is "reveille-demo".

    Generation options (`ModelOptions`) are accepted; being scripted, it cannot honour
    sampling (temperature, top_p, seed), length limits, stop sequences or response formats
    and ignores them. It does honour `tool_choice="none"` (no tool is called). A user
    message with image parts gets a reply that says the demo model cannot see images.
    """

    name = "reveille-demo"

    def __init__(self, delay_seconds: float = 1.0) -> None:
        if delay_seconds < 0:
            raise ValueError("delay_seconds must not be negative")
        self.delay_seconds = delay_seconds

    async def complete(
        self,
        messages: list[ChatMessage],
        *,
        tools: list[ToolSchema] | None = None,
        on_delta: DeltaCallback | None = None,
        options: ModelOptions | None = None,
    ) -> ModelReply:
        # Loops, not comprehensions and helpers: every demo turn runs this (a benchmark's
        # model), and each comprehension or helper is a Python call of its own.
        offered: set[str | None] = set()
        for tool in tools or ():
            offered.add(tool["function"].get("name"))
        if options is not None and options.tool_choice == "none":
            offered = set()
        content, tool_calls = await self._decide(messages, offered)
        if on_delta is not None and content:
            for piece in re.findall(r"\S+\s*|\s+", content):
                await on_delta(piece)
        prompt_tokens = 0
        for message in messages:
            prompt_tokens += len(_text(message).split())
        completion_tokens = len((content or "").split())
        for call in tool_calls:
            completion_tokens += len(call["function"]["arguments"].split())
        return ModelReply(
            content=content,
            tool_calls=tool_calls,
            usage={
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
            finish_reason="tool_calls" if tool_calls else "stop",
        )

    async def _decide(
        self, messages: list[ChatMessage], offered: set[str | None]
    ) -> tuple[str | None, list[ToolCall]]:
        # One pass over the system messages for both markers (summarising comes first).
        summarise = subagent = False
        for m in messages:
            if m.get("role") == "system":
                text = _text(m)
                summarise = summarise or SUMMARISE_MARKER in text
                subagent = subagent or SUBAGENT_MARKER in text
        if summarise:
            return _demo_summary(messages), []
        if subagent:
            await asyncio.sleep(self.delay_seconds)
            return self._subagent_step(messages, offered)

        turn = _current_turn(messages)
        # The completion texts of the turn (summarised) and its last user message, in one loop.
        summaries: list[str] = []
        last_user: ChatMessage | None = None
        for message in turn:
            role = message.get("role")
            if role == "user":
                last_user = message
            elif role != "system":
                continue
            text = _text(message)
            if is_completion_text(text):
                summaries.extend(summarise_completion_text(text))
        if messages and messages[-1].get("role") == "tool":
            return "\n\n".join([*summaries, *_tool_followups(turn)]), []

        user_text = "" if last_user is None else _text(last_user)
        if user_text and not is_completion_text(user_text):
            command = self._command(user_text, offered, len(messages))
            if command is not None:
                return command
        if summaries:
            return "\n".join(summaries), []
        reply = plain_reply(user_text)
        if last_user is not None and _has_images(last_user):
            reply = f"{IMAGE_NOTE} {reply}"
        return reply, []

    def _command(
        self, text: str, offered: set[str | None], position: int
    ) -> tuple[str | None, list[ToolCall]] | None:
        # Stripped and lowered once, for both prefixes.
        stripped = text.strip()
        lowered = stripped.lower()
        if lowered.startswith(SHELL_PREFIX):
            shell_command = stripped[len(SHELL_PREFIX) :].strip()
            if not shell_command:
                return "Tell me which command to run after 'run in the background:'.", []
            if SHELL_TOOL not in offered:
                return "I can't run commands here: the shell tool is not available.", []
            args: JSONObject = {
                "command": shell_command,
                "background": True,
                "notify_on_complete": True,
            }
            return None, [_tool_call(position, SHELL_TOOL, args)]
        client_call = _CLIENT_CALL.match(text)
        if client_call is not None:
            wanted = client_call.group(1)
            name = f"client__{wanted}" if f"client__{wanted}" in offered else wanted
            arguments = _json_or_none(client_call.group(2))
            if name not in offered or arguments is None:
                return f"I can't call the client tool {wanted} with that here.", []
            return None, [_tool_call(position, name, arguments)]
        call = _CALL.match(text)
        if call is not None:
            # "call <tool> with <JSON arguments>": any offered tool (an MCP server's ...)
            name, arguments = call.group(1), _json_or_none(call.group(2))
            if name not in offered:
                return f"I can't call {name} here: no tool of that name is offered.", []
            if arguments is None:
                return f"The arguments for {name} must be one JSON object.", []
            return None, [_tool_call(position, name, arguments)]
        remind = _REMIND.match(text)
        if remind is not None:
            note = remind.group(2).strip()
            if not note:
                return "Tell me what to remind you of after 'remind me in N seconds:'.", []
            if WAKEUP_TOOL not in offered:
                return "I can't set reminders here: schedule_wakeup is not available.", []
            wakeup_args: JSONObject = {"in_seconds": int(remind.group(1)), "note": note}
            return None, [_tool_call(position, WAKEUP_TOOL, wakeup_args)]
        every = _EVERY.match(text)
        if every is not None:
            note = every.group(2).strip()
            if not note:
                return "Tell me what to repeat after 'every N seconds:'.", []
            if SCHEDULE_TOOL not in offered:
                return "I can't set schedules here: the schedule tool is not available.", []
            schedule_args: JSONObject = {
                "action": "create",
                "every_seconds": int(every.group(1)),
                "note": note,
            }
            return None, [_tool_call(position, SCHEDULE_TOOL, schedule_args)]
        if lowered.startswith(DELEGATE_PREFIX):
            goal = stripped[len(DELEGATE_PREFIX) :].strip()
            if not goal:
                return "Tell me what to do after 'in the background:'.", []
            if DELEGATE_TOOL not in offered:
                return "I can't start background work here: delegation is not available.", []
            return None, [_tool_call(position, DELEGATE_TOOL, {"goal": goal, "background": True})]
        return None

    @staticmethod
    def _subagent_goal(messages: list[ChatMessage]) -> str:
        users = [_text(m) for m in messages if m.get("role") == "user"]
        task = users[-1] if users else ""
        match = re.search(r"^\s*Goal:\s*(.+)$", task, flags=re.MULTILINE)
        return (match.group(1) if match else task).strip() or "the delegated goal"

    def _subagent_step(
        self, messages: list[ChatMessage], offered: set[str | None]
    ) -> tuple[str | None, list[ToolCall]]:
        """A sub-agent's goal ``call <tool> with <JSON>`` calls that tool (when it has it)
        and reports its result; any other goal is declared done."""
        goal = self._subagent_goal(messages)
        if messages and messages[-1].get("role") == "tool":
            return f"Done: {goal}. Result: {first_lines(_text(messages[-1]), 3)}", []
        call = _CALL.match(goal)
        arguments = _json_or_none(call.group(2)) if call is not None else None
        if call is not None and call.group(1) in offered and arguments is not None:
            return None, [_tool_call(len(messages), call.group(1), arguments)]
        return self._subagent_result(messages), []

    @classmethod
    def _subagent_result(cls, messages: list[ChatMessage]) -> str:
        goal = cls._subagent_goal(messages)
        return f"Done: {goal.rstrip('.')}. (demo sub-agent result)"


def _tool_call(position: int, name: str, args: JSONObject) -> ToolCall:
    # The id depends only on the conversation length, so replies stay deterministic.
    return {
        "id": f"call_demo_{position}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }


def plain_reply(user_text: str) -> str:
    """The demo model's answer to a message that asks for nothing it can do (the store
    floor of ``bench/api_server.py`` stores it as a demo turn would)."""
    snippet = " ".join(user_text.split())
    if len(snippet) > _SNIPPET_CHARS:
        snippet = snippet[: _SNIPPET_CHARS - 1] + "…"
    said = f'You said: "{snippet}". ' if snippet else ""
    return (
        "This is Reveille's built-in demo model, a scripted offline stand-in, not a language "
        f"model. {said}To try background work, send 'in the background: <goal>' (a "
        "sub-agent works on it and the result comes back here) or 'run in the background: "
        "<command>' (a shell command; the shell tool must be enabled)."
    )


def _tool_followups(turn: list[ChatMessage]) -> list[str]:
    """One sentence per tool result of the latest tool step, in call order."""
    calls: dict[str, ToolCall] = {}
    for message in turn:
        for call in message.get("tool_calls") or []:
            calls[call.get("id", "")] = call
    results: list[ChatMessage] = []
    for message in reversed(turn):
        if message.get("role") != "tool":
            break
        results.insert(0, message)
    lines = []
    for result in results:
        found = calls.get(result.get("tool_call_id", ""))
        name = found["function"]["name"] if found else ""
        args = _json_or_none(found["function"]["arguments"] if found else "") or {}
        lines.append(_followup(name, args, _text(result)))
    return lines


def _followup(tool: str, args: JSONObject, result_text: str) -> str:
    result = _json_or_none(result_text)
    if tool == DELEGATE_TOOL:
        return _delegation_followup(str(args.get("goal", "")), result, result_text)
    if tool == SHELL_TOOL:
        return _shell_followup(str(args.get("command", "")), result, result_text)
    if tool == WAKEUP_TOOL:
        return _wakeup_followup(str(args.get("note", "")), result, result_text)
    if tool == SCHEDULE_TOOL and result is not None:
        if result.get("error"):
            return f"I couldn't set the schedule: {result['error']}"
        return (
            f"Schedule {result.get('id')} set: every {args.get('every_seconds')} seconds, "
            f"next at {result.get('next_due_at')}: {args.get('note')}. "
            "Each time, I'll bring it back here."
        )
    return f"{tool or 'The tool'} returned: {first_lines(result_text, 3)}"


def _delegation_followup(goal: str, result: JSONObject | None, raw: str) -> str:
    if result is None:
        return f"Result for {goal}: {first_lines(raw, 3)}"
    handle = result.get("delegation_id")
    status = result.get("status")
    if status == "dispatched" and handle:
        return (
            f"Started in the background: {goal}. Handle: {handle}. "
            "The result will come back to this conversation when it is done."
        )
    if status == "queued" and handle:
        return (
            f"Queued in the background behind other running work: {goal}. Handle: {handle}. "
            "The result will come back to this conversation when it is done."
        )
    reason = result.get("error") or status or "no reason given"
    suffix = f" (handle {handle})" if handle else ""
    return f"The background work was not started{suffix}: {reason}"


def _shell_followup(command: str, result: JSONObject | None, raw: str) -> str:
    if result is None:
        return f"`{command}`: {first_lines(raw, 3)}"
    if result.get("error"):
        return f"I couldn't run `{command}`: {result['error']}"
    if result.get("process_id"):
        pid = f", pid {result['pid']}" if result.get("pid") is not None else ""
        return (
            f"Started `{command}` in the background (process {result['process_id']}{pid}). "
            "I'll tell you here when it finishes."
        )
    if "exit_code" in result:
        output = first_lines(str(result.get("output", "")), 3) or "(no output)"
        return f"`{command}` exited with code {result['exit_code']}. Output: {output}"
    return f"`{command}`: {first_lines(raw, 3)}"


def _wakeup_followup(note: str, result: JSONObject | None, raw: str) -> str:
    if result is None:
        return f"Reminder {note!r}: {first_lines(raw, 3)}"
    if result.get("error"):
        return f"I couldn't set the reminder: {result['error']}"
    return (
        f"Reminder set for {result.get('due_at')} (id {result.get('wakeup_id')}): {note}. "
        "I'll bring it back here then."
    )
