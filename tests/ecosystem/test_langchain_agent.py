"""A LangChain agent (``langchain.agents.create_agent`` over ``ChatOpenAI``) with one client
tool, a Python function, against a real `reveille serve` whose model is a fake
OpenAI-compatible one on loopback.

The model's first answer calls both ``delegate_task`` (background, a server tool) and the
client's ``get_weather``: the server runs its own call and hands only the client's to
LangChain, which runs the function and sends its result back; the model then answers with
it. The sub-agent's result comes home to the conversation's session once, folded into a
turn once, its ledger row delivered. Over chat completions, and over the Responses API
(``use_responses_api=True``, chained by ``previous_response_id``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ecosystem.extra import require_ecosystem

require_ecosystem("langchain", "langchain_openai", "langgraph")

from langchain.agents import create_agent  # noqa: E402
from langchain_core.messages import AIMessage, ToolMessage  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402
from langgraph.graph.state import CompiledStateGraph  # noqa: E402
from pydantic import SecretStr  # noqa: E402

from tests.api_server.serve_support import KEY, Server  # noqa: E402
from tests.ecosystem.fake_model import MODEL, ThreadedModel, serving  # noqa: E402
from tests.ecosystem.homecoming import came_home_once, the_session, wait_for_the_result  # noqa: E402

QUESTION = "In the background count the stars, and tell me the weather in San Francisco."


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Server, ThreadedModel]]:
    yield from serving(tmp_path)


def _agent(
    server: Server, variant: str, asked: list[str]
) -> CompiledStateGraph[Any, Any, Any, Any]:
    def get_weather(location: str) -> str:
        """Get the current weather for a location."""
        asked.append(location)
        return "sunny, 18 C"

    model = ChatOpenAI(
        model=MODEL,
        base_url=f"{server.url}/v1",
        api_key=SecretStr(KEY),
        max_retries=0,
        streaming=variant == "chat-streaming",
        # Chained by previous_response_id: the server resumes the chain's parked turn.
        use_responses_api=variant == "responses",
        use_previous_response_id=variant == "responses",
    )
    return create_agent(model, tools=[get_weather])


@pytest.mark.parametrize("variant", ["chat", "chat-streaming", "responses"])
def test_a_langchain_agent_round_trips_a_client_tool_while_a_sub_agent_works(
    served: tuple[Server, ThreadedModel], variant: str
) -> None:
    server, model = served
    asked: list[str] = []
    agent = _agent(server, variant, asked)

    state = agent.invoke({"messages": [{"role": "user", "content": QUESTION}]})

    assert asked == ["San Francisco, CA"]  # LangChain ran the client tool, once
    messages = state["messages"]
    calls = [c["name"] for m in messages if isinstance(m, AIMessage) for c in m.tool_calls]
    assert calls == ["get_weather"]  # the server's delegate_task never reached the client
    [result] = [m for m in messages if isinstance(m, ToolMessage)]
    assert result.content == "sunny, 18 C"
    assert messages[-1].text == "The weather in San Francisco: sunny, 18 C."

    session_id = the_session(server)
    wait_for_the_result(server, session_id)
    # The next turn of the same conversation folds the result in if the resumed turn did not.
    state = agent.invoke({"messages": [*messages, {"role": "user", "content": "Thanks!"}]})
    assert state["messages"][-1].text == "Hello there, friend."
    assert the_session(server) == session_id
    came_home_once(server, session_id, model.model)
