"""The ``openai-agents`` SDK (``Agent``, ``Runner.run``, ``function_tool``) with one client
tool against a real `reveille serve` whose model is a fake OpenAI-compatible one on loopback.

As with LangChain (``test_langchain_agent.py``): the model's first answer calls both
``delegate_task`` (background, a server tool) and the client's ``get_weather``; the SDK runs
the function and sends its result back, the model answers with it, and the sub-agent's
result comes home to the conversation once. Over chat completions
(``OpenAIChatCompletionsModel``, plain and streamed) and over the Responses API
(``OpenAIResponsesModel``: chained by ``previous_response_id``, and in a
``/v1/conversations`` conversation). The SDK's tracing export is off.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ecosystem.extra import require_ecosystem

require_ecosystem("agents")

from agents import (  # noqa: E402
    Agent,
    Model,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    TResponseInputItem,
    function_tool,
    set_tracing_disabled,
)
from agents.items import ToolCallItem, ToolCallOutputItem  # noqa: E402
from agents.result import RunResultBase  # noqa: E402
from openai import AsyncOpenAI  # noqa: E402

from tests.api_server.serve_support import KEY, Server  # noqa: E402
from tests.ecosystem.fake_model import MODEL, ThreadedModel, serving  # noqa: E402
from tests.ecosystem.homecoming import came_home_once, the_session, wait_for_the_result  # noqa: E402

QUESTION = "In the background count the stars, and tell me the weather in San Francisco."
VARIANTS = ["chat", "chat-streamed", "responses", "responses-conversation"]


@pytest.fixture(autouse=True)
def no_tracing() -> Iterator[None]:
    set_tracing_disabled(True)  # the SDK would export traces to OpenAI's platform
    yield
    set_tracing_disabled(False)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Server, ThreadedModel]]:
    yield from serving(tmp_path)


def _agent(client: AsyncOpenAI, variant: str, asked: list[str]) -> Agent[None]:
    @function_tool
    def get_weather(location: str) -> str:
        """Get the current weather for a location."""
        asked.append(location)
        return "sunny, 18 C"

    model: Model
    if variant.startswith("chat"):
        model = OpenAIChatCompletionsModel(MODEL, client)
    else:
        model = OpenAIResponsesModel(MODEL, client)
    return Agent(name="assistant", instructions="Be brief.", model=model, tools=[get_weather])


async def _run(
    agent: Agent[None], variant: str, prompt: str | list[TResponseInputItem], **chain: Any
) -> RunResultBase:
    if variant == "chat-streamed":
        streamed = Runner.run_streamed(agent, prompt)
        async for _ in streamed.stream_events():
            pass
        return streamed
    return await Runner.run(agent, prompt, **chain)


async def _first_turn(
    client: AsyncOpenAI, agent: Agent[None], variant: str
) -> tuple[RunResultBase, Callable[[], Awaitable[RunResultBase]]]:
    """The question's run, and how to run one more turn of the same conversation."""
    if variant == "responses":
        first = await _run(agent, variant, QUESTION, auto_previous_response_id=True)
        chain: dict[str, Any] = {"previous_response_id": first.last_response_id}
        return first, lambda: _run(agent, variant, "Thanks!", **chain)
    if variant == "responses-conversation":
        conversation = await client.conversations.create()
        first = await _run(agent, variant, QUESTION, conversation_id=conversation.id)
        return first, lambda: _run(agent, variant, "Thanks!", conversation_id=conversation.id)
    first = await _run(agent, variant, QUESTION)
    thanks: TResponseInputItem = {"role": "user", "content": "Thanks!"}
    history = [*first.to_input_list(), thanks]
    return first, lambda: _run(agent, variant, history)


@pytest.mark.parametrize("variant", VARIANTS)
def test_an_openai_agents_run_round_trips_a_client_tool_while_a_sub_agent_works(
    served: tuple[Server, ThreadedModel], variant: str
) -> None:
    server, model = served
    asked: list[str] = []

    async def scenario() -> tuple[RunResultBase, RunResultBase]:
        client = AsyncOpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
        agent = _agent(client, variant, asked)
        first, next_turn = await _first_turn(client, agent, variant)
        # The sub-agent's result is home (folded into the resumed turn, or waiting for the
        # next one): the next turn must not see it a second time.
        await asyncio.to_thread(wait_for_the_result, server, the_session(server))
        return first, await next_turn()

    first, second = asyncio.run(scenario())

    assert asked == ["San Francisco, CA"]  # the SDK ran the client tool, once
    calls = [item.raw_item for item in first.new_items if isinstance(item, ToolCallItem)]
    assert [getattr(call, "name", None) for call in calls] == ["get_weather"]
    outputs = [item.output for item in first.new_items if isinstance(item, ToolCallOutputItem)]
    assert outputs == ["sunny, 18 C"]
    assert first.final_output == "The weather in San Francisco: sunny, 18 C."
    assert second.final_output == "Hello there, friend."
    came_home_once(server, the_session(server), model.model)
