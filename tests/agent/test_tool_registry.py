"""The tool registry: schemas, dispatch, and every error path returned (not raised) to the model."""

from __future__ import annotations

import json

import pytest

from agent.providers.demo import DemoModel
from agent.tools import Tool, ToolContext, ToolRegistry
from tools.toolset import build_default_registry


async def _echo(args, ctx):
    return {"echo": args, "session": ctx.session_id}


async def _text(args, ctx):
    return "plain text"


async def _boom(args, ctx):
    raise RuntimeError("disk on fire")


def _tool(name="echo", handler=_echo, required=("value",)):
    return Tool(
        name=name,
        description=f"{name} tool",
        parameters={
            "type": "object",
            "properties": {"value": {"type": "string"}},
            "required": list(required),
        },
        handler=handler,
    )


CTX = ToolContext(session_id="s1", session_key="k1", origin_ui_session_id=None, platform="api")


def test_duplicate_name_is_rejected():
    registry = ToolRegistry([_tool()])
    with pytest.raises(ValueError, match="already registered"):
        registry.register(_tool())


def test_schemas_use_the_openai_tools_format():
    registry = ToolRegistry([_tool()])
    assert registry.schemas() == [
        {
            "type": "function",
            "function": {
                "name": "echo",
                "description": "echo tool",
                "parameters": {
                    "type": "object",
                    "properties": {"value": {"type": "string"}},
                    "required": ["value"],
                },
            },
        }
    ]
    assert "echo" in registry
    assert len(registry) == 1


async def test_call_returns_dict_results_as_json_and_passes_the_context():
    registry = ToolRegistry([_tool()])
    result = await registry.call("echo", '{"value": "hi"}', CTX)
    assert json.loads(result) == {"echo": {"value": "hi"}, "session": "s1"}


async def test_string_results_are_returned_verbatim():
    registry = ToolRegistry([_tool("text", _text, required=())])
    assert await registry.call("text", "{}", CTX) == "plain text"


async def test_empty_arguments_mean_no_arguments():
    registry = ToolRegistry([_tool("text", _text, required=())])
    assert await registry.call("text", "", CTX) == "plain text"


@pytest.mark.parametrize(
    ("name", "arguments", "fragment"),
    [
        ("nope", "{}", "unknown tool 'nope'"),
        ("echo", "{not json", "not valid JSON"),
        ("echo", "[1, 2]", "must be a JSON object"),
        ("echo", "{}", "missing required argument(s): value"),
        ("echo", '{"value": null}', "missing required argument(s): value"),
    ],
)
async def test_bad_calls_become_error_strings(name, arguments, fragment):
    registry = ToolRegistry([_tool()])
    result = await registry.call(name, arguments, CTX)
    assert fragment in json.loads(result)["error"]


async def test_unknown_tool_error_lists_the_available_tools():
    registry = ToolRegistry([_tool()])
    assert "available tools: echo" in json.loads(await registry.call("x", "{}", CTX))["error"]


async def test_handler_exception_is_returned_not_raised():
    registry = ToolRegistry([_tool("boom", _boom, required=())])
    error = json.loads(await registry.call("boom", "{}", CTX))["error"]
    assert "boom failed" in error
    assert "RuntimeError: disk on fire" in error


async def test_the_default_toolset_comes_from_the_tools_floor():
    registry = build_default_registry(DemoModel(delay_seconds=0), shell_enabled=False)
    assert registry.names() == ["delegate_task", "terminal", "schedule_wakeup", "schedule", "watch"]
    refused = json.loads(await registry.call("terminal", '{"command": "true"}', CTX))
    assert "disabled" in refused["error"]


async def test_progress_is_told_around_each_call_and_a_failing_listener_is_harmless():
    from agent.tools import ToolProgress

    heard: list[ToolProgress] = []

    async def listen(step: ToolProgress) -> None:
        heard.append(step)
        raise RuntimeError("the listener broke")  # must not fail the call

    registry = ToolRegistry([_tool("text", _text, required=())])
    ctx = ToolContext(on_progress=listen)
    result = await registry.call("text", "{}", ctx, "call-7")
    assert "error" not in result
    assert [(s.call_id, s.name, s.phase, s.ok) for s in heard] == [
        ("call-7", "text", "started", True),
        ("call-7", "text", "finished", True),
    ]
    heard.clear()
    await registry.call("nope", "{}", ctx, "call-8")
    assert [(s.phase, s.ok) for s in heard] == [("started", True), ("finished", False)]
