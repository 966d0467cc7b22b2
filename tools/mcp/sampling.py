"""An MCP server's ``sampling/createMessage``, answered by Reveille's configured model provider.

``[mcp.servers.NAME] sampling`` decides: ``"ask"`` (the default) asks a person first, through
the confirmation hook of the call in flight, like a tool call's approval (no call in flight,
nobody to ask, a no or no answer in time: refused); ``"allow"`` samples at once; ``"deny"``
does not offer the capability at all. The server's messages (text; other content is named)
and system prompt become a chat request; ``maxTokens``, ``temperature`` and
``stopSequences`` go as the provider's options. Sampling with tools is not offered.
"""

from __future__ import annotations

import logging

import mcp_types as types

from agent.messages import ChatMessage
from agent.providers.base import ModelOptions, ModelProvider, ProviderError
from agent.tools import ApprovalExpired, ToolContext

logger = logging.getLogger(__name__)

# JSON-RPC code the MCP specification gives a client's refusal of a sampling request.
REFUSED = -1
_SHOWN = 300


def refused(message: str) -> types.ErrorData:
    return types.ErrorData(code=REFUSED, message=message)


def chat_messages(params: types.CreateMessageRequestParams) -> list[ChatMessage]:
    """The request as the provider reads it."""
    messages: list[ChatMessage] = []
    if params.system_prompt:
        messages.append({"role": "system", "content": params.system_prompt})
    for message in params.messages:
        text = "\n".join(_text(block) for block in message.content_as_list)
        if message.role == "assistant":
            messages.append({"role": "assistant", "content": text})
        else:
            messages.append({"role": "user", "content": text})
    return messages


def options(params: types.CreateMessageRequestParams) -> ModelOptions:
    return ModelOptions(
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        stop=tuple(params.stop_sequences) if params.stop_sequences else None,
    )


def question(server: str, params: types.CreateMessageRequestParams) -> str:
    """What a person is asked: who wants the model, and the request's last message."""
    last = params.messages[-1] if params.messages else None
    said = "\n".join(_text(b) for b in last.content_as_list) if last is not None else ""
    said = " ".join(said.split())
    if len(said) > _SHOWN:
        said = said[: _SHOWN - 1] + "…"
    return f"MCP server {server} asks to use the model (at most {params.max_tokens} tokens): {said}"


async def sample(
    server: str,
    provider: ModelProvider | None,
    params: types.CreateMessageRequestParams,
    *,
    ask: bool,
    caller: ToolContext | None,
) -> types.CreateMessageResult | types.ErrorData:
    """Answer the request (see the module docstring); ``ask``: a person's yes comes first,
    through ``caller`` (the call in flight)."""
    if params.tools:
        return refused("sampling with tools is not supported by this client")
    if provider is None:
        return refused("this client has no model to sample")
    if ask:
        if caller is None or caller.confirm is None:
            logger.warning(
                "MCP server %s asked to sample with nobody to approve it; refused", server
            )
            return refused("nobody could approve the sampling request")
        try:
            approved = await caller.confirm(question(server, params))
        except ApprovalExpired:
            logger.warning("MCP server %s's sampling request expired unanswered", server)
            return refused("nobody approved the sampling request in time")
        if not approved:
            return refused("the user rejected the sampling request")
    try:
        reply = await provider.complete(chat_messages(params), options=options(params))
    except ProviderError as exc:
        logger.warning("MCP server %s's sampling request failed: %s", server, exc)
        return types.ErrorData(code=types.INTERNAL_ERROR, message=f"the model failed: {exc}")
    logger.info("MCP server %s sampled the model %s", server, provider.name)
    return types.CreateMessageResult(
        role="assistant",
        content=types.TextContent(type="text", text=reply.content or ""),
        model=provider.name,
        stop_reason="maxTokens" if reply.finish_reason == "length" else "endTurn",
    )


def _text(block: object) -> str:
    if isinstance(block, types.TextContent):
        return block.text
    return f"[{getattr(block, 'type', 'content')}]"
