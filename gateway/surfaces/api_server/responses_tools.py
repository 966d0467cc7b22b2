"""The client-tool checks of ``POST /v1/responses``, before a response row is written:
its ``tools`` and ``tool_choice`` (400 for anything but function tools, or a choice that
names no offered tool), the ``X-Reveille-Server-Tools`` switch, and whether the chain's
session fits the request: 409 ``tool_calls_pending`` for a new message while its turn waits
for the client's results, 400 for results nobody waits for (``gateway.turns.client_calls``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Any

from aiohttp import web

from agent.tools import ToolOutput
from gateway.http.middleware import api_error_of
from gateway.openai.client_tools import (
    SERVER_TOOLS_HEADER,
    read_tool_request,
    server_tools_wanted,
)
from gateway.openai.responses_wire import ResponsesRequest
from gateway.turns.client_calls import check_request, find_parked
from gateway.turns.service import TurnError, TurnService

__all__ = ["check_client_tools", "check_park"]


def check_client_tools(
    request: web.Request, body: Any, parsed: ResponsesRequest, server_names: Collection[str]
) -> ResponsesRequest:
    """``parsed`` with the server-tools switch set; 400 for tools it cannot take."""
    wanted = server_tools_wanted(request.headers.get(SERVER_TOOLS_HEADER))
    read_tool_request(body, server_names, server_tools=wanted, responses=True)
    return dataclasses.replace(parsed, server_tools=wanted)


async def check_park(turns: TurnService, parsed: ResponsesRequest, session_id: str | None) -> None:
    """Refuse, before anything is stored, a request that does not fit the park of the
    session it continues (its chain's, or its conversation's; None: a new session)."""
    outputs = [ToolOutput(str(o["call_id"]), str(o["output"])) for o in parsed.tool_outputs]
    if session_id is None:
        parked = None
    else:
        parked = await find_parked(turns.store, session_id)
        if parked is not None and parked.expired():
            parked = None  # the turn service ends it when this request's turn begins
    try:
        check_request(parked, outputs or None, wakeup=False)
    except TurnError as exc:
        raise api_error_of(exc) from None
