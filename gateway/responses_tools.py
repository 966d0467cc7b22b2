"""What a stored Responses request says about client tools, as the turn service takes it:
the tool offer, the model options with ``tool_choice`` in the model's names, and the
client's results for a parked turn (``gateway.turns.client_calls``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import TypedDict

from agent.providers.base import ModelOptions
from agent.tools import ToolOffer, ToolOutput
from gateway.openai.client_tools import read_tool_request
from gateway.openai.responses_wire import ResponsesRequest

__all__ = ["TurnTools", "client_tools_of"]


class TurnTools(TypedDict):
    """The ``TurnRequest`` fields a Responses request's tools set."""

    model_options: ModelOptions | None
    tool_offer: ToolOffer | None
    tool_outputs: tuple[ToolOutput, ...] | None


def client_tools_of(request: ResponsesRequest, server_names: Collection[str]) -> TurnTools:
    """The tool fields of the turn that runs ``request`` (checked when it was created)."""
    options = request.model_options()
    asked = {"tools": request.tools, "tool_choice": request.tool_choice}
    tools = read_tool_request(
        asked, server_names, server_tools=request.server_tools, responses=True
    )
    offer: ToolOffer | None = tools.offer
    if not tools.offer.client and request.server_tools and tools.offer.allowed is None:
        offer = None
    if "tool_choice" in request.options:  # sent by the client: in the model's names
        options = dataclasses.replace(options or ModelOptions(), tool_choice=tools.tool_choice)
    outputs = tuple(ToolOutput(str(o["call_id"]), str(o["output"])) for o in request.tool_outputs)
    return {
        "model_options": options,
        "tool_offer": offer,
        "tool_outputs": outputs or None,
    }
