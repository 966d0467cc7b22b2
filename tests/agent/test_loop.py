"""The agent loop: tool calls and results in order, the step limit, errors fed back, streaming."""

from __future__ import annotations

import asyncio
import json

from agent.loop import Agent
from agent.providers.base import ModelReply
from agent.tools import Tool, ToolContext, ToolRegistry

CTX = ToolContext(session_id="sess", session_key="key")


def _call(call_id, name, args):
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args)},
    }


def _usage(n):
    return {"prompt_tokens": n, "completion_tokens": 1, "total_tokens": n + 1}


class ScriptedProvider:
    """Plays back replies in order, streaming each reply's `stream` pieces first."""

    name = "scripted"

    def __init__(self, replies):
        self.replies = list(replies)
        self.requests = []

    async def complete(self, messages, *, tools=None, on_delta=None):
        self.requests.append({"messages": [dict(m) for m in messages], "tools": tools})
        reply, pieces = self.replies.pop(0)
        if on_delta is not None:
            for piece in pieces:
                await on_delta(piece)
        return reply


class LoopingProvider:
    """Asks for a tool call forever."""

    name = "looping"

    def __init__(self):
        self.calls = 0

    async def complete(self, messages, *, tools=None, on_delta=None):
        self.calls += 1
        return ModelReply(None, [_call(f"c{self.calls}", "add", {"a": 1, "b": 1})], _usage(1))


async def _add(args, ctx):
    return {"sum": args["a"] + args["b"], "session": ctx.session_key}


async def _fail(args, ctx):
    raise ValueError("no such file")


def _registry():
    registry = ToolRegistry()
    schema = {"type": "object", "properties": {}, "required": ["a", "b"]}
    registry.register(Tool("add", "adds", schema, _add))
    registry.register(Tool("fail", "fails", {"type": "object", "properties": {}}, _fail))
    return registry


async def test_tool_call_then_result_then_answer():
    provider = ScriptedProvider(
        [
            (ModelReply(None, [_call("c1", "add", {"a": 2, "b": 3})], _usage(10)), []),
            (ModelReply("The sum is 5.", [], _usage(20), "stop"), []),
        ]
    )
    user = [{"role": "user", "content": "add 2 and 3"}]
    result = await Agent(provider, _registry()).run(user, CTX)

    assert result.content == "The sum is 5."
    assert result.steps == 2
    assert result.usage == {"prompt_tokens": 30, "completion_tokens": 2, "total_tokens": 32}
    assert [m["role"] for m in result.new_messages] == ["assistant", "tool", "assistant"]
    assistant, tool, final = result.new_messages
    assert assistant["tool_calls"][0]["id"] == "c1"
    assert tool["tool_call_id"] == "c1"
    assert json.loads(tool["content"]) == {"sum": 5, "session": "key"}
    assert final == {"role": "assistant", "content": "The sum is 5."}
    # The second model call saw the whole exchange, tools were offered each time, and the
    # caller's list was left alone.
    assert provider.requests[1]["messages"] == user + result.new_messages[:2]
    assert {t["function"]["name"] for t in provider.requests[0]["tools"]} == {"add", "fail"}
    assert user == [{"role": "user", "content": "add 2 and 3"}]


async def test_several_tool_calls_in_one_step_run_in_order():
    provider = ScriptedProvider(
        [
            (
                ModelReply(
                    None,
                    [_call("a", "add", {"a": 1, "b": 1}), _call("b", "add", {"a": 2, "b": 2})],
                ),
                [],
            ),
            (ModelReply("done"), []),
        ]
    )
    result = await Agent(provider, _registry()).run([{"role": "user", "content": "x"}], CTX)
    tools = [m for m in result.new_messages if m["role"] == "tool"]
    assert [t["tool_call_id"] for t in tools] == ["a", "b"]
    assert [json.loads(t["content"])["sum"] for t in tools] == [2, 4]


async def test_step_limit_returns_a_final_answer_instead_of_raising():
    provider = LoopingProvider()
    deltas = []

    async def on_delta(piece):
        deltas.append(piece)

    result = await Agent(provider, _registry(), max_steps=3).run(
        [{"role": "user", "content": "loop"}], CTX, on_delta=on_delta
    )
    assert provider.calls == 3
    assert result.steps == 3
    assert "step limit" in result.content
    assert result.new_messages[-1] == {"role": "assistant", "content": result.content}
    assert "".join(deltas) == result.content
    assert sum(1 for m in result.new_messages if m["role"] == "tool") == 3


async def test_tool_errors_are_fed_back_to_the_model():
    provider = ScriptedProvider(
        [
            (ModelReply(None, [_call("c1", "fail", {})]), []),
            (ModelReply(None, [_call("c2", "missing_tool", {})]), []),
            (ModelReply(None, [_call("c3", "add", {"a": 1})]), []),
            (ModelReply("I could not do it."), []),
        ]
    )
    result = await Agent(provider, _registry()).run([{"role": "user", "content": "go"}], CTX)
    assert result.content == "I could not do it."
    errors = [json.loads(m["content"])["error"] for m in result.new_messages if m["role"] == "tool"]
    assert "ValueError: no such file" in errors[0]
    assert "unknown tool 'missing_tool'" in errors[1]
    assert "missing required argument(s): b" in errors[2]
    last_request = provider.requests[-1]["messages"]
    assert last_request[-1]["role"] == "tool"
    assert "missing required" in last_request[-1]["content"]


async def test_every_step_streams_live_and_the_answer_is_what_was_shown():
    provider = ScriptedProvider(
        [
            (
                ModelReply("Let me add that.", [_call("c1", "add", {"a": 1, "b": 2})]),
                ["Let me ", "add that."],
            ),
            (ModelReply("It is 3."), ["It ", "is ", "3."]),
        ]
    )
    deltas = []

    async def on_delta(piece):
        deltas.append(piece)

    result = await Agent(provider, _registry()).run(
        [{"role": "user", "content": "1+2"}], CTX, on_delta=on_delta
    )
    # The text before the tool call is shown as it arrives, not held until the step ends.
    assert deltas == ["Let me ", "add that.", "\n\nIt ", "is ", "3."]
    assert "".join(deltas) == result.content == "Let me add that.\n\nIt is 3."
    # The intermediate text stays in the transcript, attached to its tool calls.
    assert result.new_messages[0]["content"] == "Let me add that."


async def test_without_tools_the_answer_streams_live():
    order = []

    class LiveProvider:
        name = "live"

        async def complete(self, messages, *, tools=None, on_delta=None):
            assert tools is None
            await on_delta("a")
            order.append("after-first-piece")
            await on_delta("b")
            return ModelReply("ab")

    async def on_delta(piece):
        order.append(piece)

    result = await Agent(LiveProvider(), ToolRegistry()).run([], CTX, on_delta=on_delta)
    assert result.content == "ab"
    assert order == ["a", "after-first-piece", "b"]


async def test_system_prompt_is_merged_into_a_leading_system_message():
    provider = ScriptedProvider([(ModelReply("ok"), []), (ModelReply("ok"), [])])
    agent = Agent(provider, ToolRegistry(), system_prompt="Be brief.")
    await agent.run([{"role": "user", "content": "hi"}], CTX)
    await agent.run(
        [{"role": "system", "content": "Session notes."}, {"role": "user", "content": "hi"}], CTX
    )
    first, second = (r["messages"] for r in provider.requests)
    assert first[0] == {"role": "system", "content": "Be brief."}
    assert second[0] == {"role": "system", "content": "Be brief.\n\nSession notes."}
    assert [m["role"] for m in second] == ["system", "user"]


async def test_tool_calls_missing_ids_get_stable_ones():
    provider = ScriptedProvider(
        [
            (
                ModelReply(None, [{"function": {"name": "add", "arguments": {"a": 1, "b": 1}}}]),
                [],
            ),
            (ModelReply("2"), []),
        ]
    )
    result = await Agent(provider, _registry()).run([{"role": "user", "content": "x"}], CTX)
    call = result.new_messages[0]["tool_calls"][0]
    assert call == {
        "id": "call_0",
        "type": "function",
        "function": {"name": "add", "arguments": '{"a": 1, "b": 1}'},
    }
    assert result.new_messages[1]["tool_call_id"] == "call_0"


async def test_with_tools_the_first_piece_reaches_the_caller_before_the_step_ends():
    seen = asyncio.Event()

    class WaitsForItsReader:
        """Sends one piece, then will not finish its step until the caller has it."""

        name = "patient"

        def __init__(self):
            self.steps = 0

        async def complete(self, messages, *, tools=None, on_delta=None):
            self.steps += 1
            if self.steps == 1:
                await on_delta("Looking it up... ")
                await asyncio.wait_for(seen.wait(), 5)  # a held-back piece would time out
                return ModelReply("Looking it up... ", [_call("c1", "add", {"a": 2, "b": 2})])
            await on_delta("4.")
            return ModelReply("4.")

    async def on_delta(piece):
        seen.set()

    result = await Agent(WaitsForItsReader(), _registry()).run(
        [{"role": "user", "content": "2+2"}], CTX, on_delta=on_delta
    )
    assert result.content == "Looking it up... \n\n4."
