"""The offline demo model: each documented rule, determinism, streaming and usage."""

from __future__ import annotations

import json
import time

import pytest

from agent.loop import Agent, subagent_messages
from agent.providers.demo import DemoModel
from agent.tools import Tool, ToolContext, ToolRegistry

TOOLS = [
    {"type": "function", "function": {"name": "delegate_task", "parameters": {}}},
    {"type": "function", "function": {"name": "terminal", "parameters": {}}},
]


def user(text):
    return {"role": "user", "content": text}


def _args(reply):
    assert reply.content is None
    assert len(reply.tool_calls) == 1
    call = reply.tool_calls[0]
    assert call["type"] == "function"
    return call["function"]["name"], json.loads(call["function"]["arguments"])


def _after_tool(command_text, tool_result):
    """The conversation as the agent loop builds it once a tool answered."""
    return [
        user(command_text),
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_demo_1",
                    "type": "function",
                    "function": {"name": tool_result[0], "arguments": json.dumps(tool_result[1])},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_demo_1", "content": json.dumps(tool_result[2])},
    ]


async def test_plain_answer_says_it_is_a_demo_and_is_deterministic():
    model = DemoModel(delay_seconds=0)
    first = await model.complete([user("Hello there")], tools=TOOLS)
    second = await DemoModel(delay_seconds=0).complete([user("Hello there")], tools=TOOLS)
    assert first == second
    assert first.tool_calls == []
    assert first.finish_reason == "stop"
    assert "demo model" in first.content
    assert "not a language model" in first.content
    assert "in the background:" in first.content
    assert "run in the background:" in first.content
    assert "Hello there" in first.content


@pytest.mark.parametrize(
    "text", ["in the background: count the stars", "  IN THE BACKGROUND:   count the stars  "]
)
async def test_in_the_background_delegates(text):
    reply = await DemoModel().complete([user(text)], tools=TOOLS)
    assert _args(reply) == ("delegate_task", {"goal": "count the stars", "background": True})
    assert reply.finish_reason == "tool_calls"


async def test_run_in_the_background_starts_a_notifying_shell_process():
    reply = await DemoModel().complete(
        [user("Run in the background: sleep 2; echo hi")], tools=TOOLS
    )
    assert _args(reply) == (
        "terminal",
        {"command": "sleep 2; echo hi", "background": True, "notify_on_complete": True},
    )


async def test_commands_without_the_tool_on_offer_get_a_plain_refusal():
    reply = await DemoModel().complete([user("in the background: x")], tools=None)
    assert reply.tool_calls == []
    assert "not available" in reply.content
    reply = await DemoModel().complete([user("run in the background: ls")], tools=TOOLS[:1])
    assert reply.tool_calls == []
    assert "shell tool is not available" in reply.content


async def test_command_with_nothing_after_it_asks_for_more():
    reply = await DemoModel().complete([user("in the background:")], tools=TOOLS)
    assert reply.tool_calls == []
    assert "Tell me what to do" in reply.content


async def test_after_delegation_it_quotes_the_handle():
    messages = _after_tool(
        "in the background: count the stars",
        (
            "delegate_task",
            {"goal": "count the stars", "background": True},
            {"status": "dispatched", "delegation_id": "deleg_0123abcd"},
        ),
    )
    reply = await DemoModel().complete(messages, tools=TOOLS)
    assert reply.tool_calls == []
    assert "Started in the background: count the stars" in reply.content
    assert "deleg_0123abcd" in reply.content


async def test_after_a_queued_or_rejected_delegation_it_says_so():
    queued = _after_tool(
        "in the background: a",
        ("delegate_task", {"goal": "a"}, {"status": "queued", "delegation_id": "deleg_q"}),
    )
    assert "Queued" in (await DemoModel().complete(queued, tools=TOOLS)).content
    rejected = _after_tool(
        "in the background: a",
        ("delegate_task", {"goal": "a"}, {"status": "rejected", "error": "too many children"}),
    )
    content = (await DemoModel().complete(rejected, tools=TOOLS)).content
    assert "not started" in content
    assert "too many children" in content


async def test_after_a_background_shell_start_it_reports_the_process():
    messages = _after_tool(
        "run in the background: make test",
        (
            "terminal",
            {"command": "make test"},
            {"process_id": "proc_42", "pid": 4242, "status": "running"},
        ),
    )
    content = (await DemoModel().complete(messages, tools=TOOLS)).content
    assert "Started `make test` in the background" in content
    assert "proc_42" in content
    assert "4242" in content


async def test_when_the_shell_is_disabled_it_says_so():
    error = "the shell tool is disabled; enable it with REVEILLE_SHELL_ENABLED=1"
    messages = _after_tool(
        "run in the background: make test",
        ("terminal", {"command": "make test"}, {"error": error}),
    )
    content = (await DemoModel().complete(messages, tools=TOOLS)).content
    assert "couldn't run `make test`" in content
    assert "REVEILLE_SHELL_ENABLED=1" in content


async def test_wake_up_for_a_delegation_is_summarised():
    wake = (
        "[reveille:wake] A background task you started has finished.\n"
        "Delegation: deleg_abc\n"
        "Goal: count the stars\n"
        "Context: for the astronomy club\n"
        "Dispatched at: 2025-01-01T00:00:00Z\n"
        "Status: completed\n"
        "Summary: There are about 10^24 stars.\n"
        "Duration: 1.0 s\n"
    )
    reply = await DemoModel().complete(
        [
            user("in the background: count the stars"),
            {"role": "assistant", "content": "ok"},
            user(wake),
        ],
        tools=TOOLS,
    )
    assert reply.tool_calls == []
    assert reply.content == (
        "Background work finished: count the stars: completed. Result: There are about 10^24 stars."
    )


async def test_wake_up_for_a_process_quotes_the_first_lines_of_output():
    wake = (
        "[reveille:wake]\n"
        "**Command:** `make test`\n"
        "**Exit code:** 1\n"
        "Output:\n"
        "```\n"
        "FAILED test_a.py::test_x\n"
        "error: expected 2, got 3\n"
        "3 passed, 1 failed\n"
        "trailing line\n"
        "```\n"
    )
    content = (await DemoModel().complete([user(wake)], tools=TOOLS)).content
    assert content == (
        "Background work finished: `make test`: exit code 1. Result: "
        "FAILED test_a.py::test_x | error: expected 2, got 3 | 3 passed, 1 failed"
    )


async def test_failed_delegation_reports_its_error():
    wake = "[reveille:wake]\nGoal: fetch the page\nStatus: failed\nError: connection refused\n"
    content = (await DemoModel().complete([user(wake)], tools=TOOLS)).content
    assert content == (
        "Background work finished: fetch the page: failed. Result: connection refused"
    )


async def test_folded_delivery_rows_are_summarised_each():
    folded = {
        "role": "system",
        "content": (
            "Results of background work delivered to this session:\n"
            "[reveille:delivery]\nGoal: task one\nStatus: completed\nSummary: first result\n"
            "[reveille:delivery]\nGoal: task two\nStatus: failed\nError: boom\n"
        ),
    }
    reply = await DemoModel().complete([folded, user("anything new?")], tools=TOOLS)
    assert reply.content.splitlines() == [
        "Background work finished: task one: completed. Result: first result",
        "Background work finished: task two: failed. Result: boom",
    ]


async def test_unstructured_wake_text_is_still_summarised():
    content = (
        await DemoModel().complete([user("[reveille:wake]\nsomething finished: all good")])
    ).content
    assert content.startswith("Background work finished: background task: finished.")
    assert "all good" in content


async def test_a_wake_answered_earlier_is_not_summarised_again():
    history = [
        user("[reveille:wake]\nGoal: old\nStatus: completed\nSummary: old result"),
        {"role": "assistant", "content": "Background work finished: old ..."},
        user("hello"),
    ]
    content = (await DemoModel().complete(history, tools=TOOLS)).content
    assert "old result" not in content
    assert "demo model" in content


async def test_delivery_plus_a_command_does_both():
    messages = [
        {
            "role": "system",
            "content": "[reveille:delivery]\nGoal: g1\nStatus: completed\nSummary: s1",
        },
        user("in the background: g2"),
    ]
    first = await DemoModel().complete(messages, tools=TOOLS)
    assert _args(first)[0] == "delegate_task"
    messages += [
        {"role": "assistant", "content": None, "tool_calls": first.tool_calls},
        {
            "role": "tool",
            "tool_call_id": first.tool_calls[0]["id"],
            "content": json.dumps({"status": "dispatched", "delegation_id": "deleg_2"}),
        },
    ]
    content = (await DemoModel().complete(messages, tools=TOOLS)).content
    assert content.startswith("Background work finished: g1: completed. Result: s1")
    assert "deleg_2" in content


async def test_subagent_sleeps_then_returns_a_result_derived_from_the_goal():
    model = DemoModel(delay_seconds=0.2)
    started = time.monotonic()
    reply = await model.complete(subagent_messages("count the stars", "be quick"))
    assert time.monotonic() - started >= 0.2
    assert reply.content == "Done: count the stars. (demo sub-agent result)"
    assert reply.tool_calls == []


async def test_subagent_mode_never_calls_tools():
    messages = subagent_messages("in the background: recurse", None)
    reply = await DemoModel(delay_seconds=0).complete(messages, tools=TOOLS)
    assert reply.tool_calls == []
    assert reply.content == "Done: in the background: recurse. (demo sub-agent result)"


async def test_content_streams_word_by_word():
    pieces = []

    async def on_delta(piece):
        pieces.append(piece)

    reply = await DemoModel().complete([user("hi")], on_delta=on_delta)
    assert len(pieces) > 10
    assert "".join(pieces) == reply.content
    assert all(len(piece.split()) == 1 for piece in pieces)


async def test_tool_call_steps_stream_nothing():
    pieces = []

    async def on_delta(piece):
        pieces.append(piece)

    await DemoModel().complete([user("in the background: x")], tools=TOOLS, on_delta=on_delta)
    assert pieces == []


async def test_usage_counts_words():
    reply = await DemoModel().complete([user("one two three")])
    assert reply.usage["prompt_tokens"] == 3
    assert reply.usage["completion_tokens"] == len(reply.content.split())
    assert reply.usage["total_tokens"] == 3 + len(reply.content.split())


def test_negative_delay_is_rejected():
    with pytest.raises(ValueError):
        DemoModel(delay_seconds=-1)


async def test_through_the_agent_loop_a_background_request_returns_the_handle():
    seen = {}

    async def fake_delegate(args, ctx):
        seen["args"] = args
        seen["session_key"] = ctx.session_key
        return {"status": "dispatched", "delegation_id": "deleg_feedface"}

    registry = ToolRegistry(
        [Tool("delegate_task", "d", {"type": "object", "required": ["goal"]}, fake_delegate)]
    )
    deltas = []

    async def on_delta(piece):
        deltas.append(piece)

    result = await Agent(DemoModel(delay_seconds=0), registry).run(
        [user("in the background: write the report")],
        ToolContext(session_key="agent:main:api:dm:1"),
        on_delta=on_delta,
    )
    assert seen == {
        "args": {"goal": "write the report", "background": True},
        "session_key": "agent:main:api:dm:1",
    }
    assert "deleg_feedface" in result.content
    assert "".join(deltas) == result.content
    assert result.steps == 2
    assert [m["role"] for m in result.new_messages] == ["assistant", "tool", "assistant"]
