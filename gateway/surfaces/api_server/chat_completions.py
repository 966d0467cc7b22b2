"""``POST /v1/chat/completions`` of the API server: the OpenAI chat wire (JSON, or SSE with
tool steps as ``event: reveille.tool`` and a parked approval as ``event: reveille.approval``)
over ``gateway.turns.service``.

Client function ``tools`` are offered beside the server's own (``X-Reveille-Server-Tools:
off``: instead of them); a call of one ends the turn with ``tool_calls`` and
``finish_reason: "tool_calls"`` (streamed as ``delta.tool_calls`` chunks), and the client
resumes it by sending the conversation with its ``role: "tool"`` results
(``gateway.openai.client_tools``, ``gateway.turns.client_calls``).

Which session a request continues (``X-Hermes-Session-Id``, keyed callers only, or the one
derived from the conversation), its ``Idempotency-Key`` scoped by session and by who sends
it, and this server's own wake-ups (proved by the wake token) answered 503 instead of 409
while the session is busy: see ``gateway.surfaces.api_server.adapter``'s docstring.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, replace
from typing import Any

from aiohttp import web

from agent.tools import ToolOffer, ToolProgress
from delivery import traces
from delivery.ids import new_token
from gateway.config import Platform
from gateway.http.middleware import (
    RETRY_AFTER_SECONDS,
    SESSION_HEADER,
    SESSION_REQUEST_KEY,
    ApiError,
    api_error_of,
    open_event_stream,
)
from gateway.openai.chat_body import ChatBody, parse_chat_body
from gateway.openai.client_tools import (
    SERVER_TOOLS_HEADER,
    read_tool_request,
    server_tools_wanted,
)
from gateway.openai.known_params import check_chat_params
from gateway.openai.wire import (
    chunker,
    completion_text,
    finish_reason_of,
    json_answer,
    send_sse,
)
from gateway.session import SessionSource, SessionStore, is_valid_session_id
from gateway.surfaces.api_server.auth import is_keyed, same_secret
from gateway.surfaces.api_server.preamble import (
    idempotency_key,
    refuse_while_draining,
    with_keepalives,
)
from gateway.surfaces.api_server.sessions import MALFORMED_SESSION_ID
from gateway.turns.gate import first_answer
from gateway.turns.service import ReplayedTurn, TurnError, TurnRequest, TurnService

__all__ = ["APPROVAL_EVENT", "TOOL_EVENT", "WAKE_TOKEN_HEADER", "ChatCompletionsRoute"]

logger = logging.getLogger(__name__)

TOOL_EVENT = "reveille.tool"
APPROVAL_EVENT = "reveille.approval"
WAKE_TOKEN_HEADER = "X-Reveille-Wake-Token"

ReadJson = Callable[[web.Request], Awaitable[Any]]


class ChatCompletionsRoute:
    """The chat completions handler of one API server (see the module docstring)."""

    def __init__(
        self,
        turns: TurnService,
        store: SessionStore,
        *,
        read_json: ReadJson,
        check_model: Callable[[str], None],
        model_name: Callable[[], str],
        is_draining: Callable[[], bool],
        wake_token: str,
        keepalive_seconds: float,
    ) -> None:
        self.turns = turns
        self.store = store
        self._read_json = read_json
        self._check_model = check_model
        self._model_name = model_name
        self._is_draining = is_draining
        self._wake_token = wake_token
        self._keepalive_seconds = keepalive_seconds

    def add_to(self, router: web.UrlDispatcher) -> None:
        router.add_post("/v1/chat/completions", self._chat_completions)

    # ----------------------------------------------------------------- the caller and its session

    def _scoped_key(self, request: web.Request, session_id: str, key: str) -> tuple[str, bool]:
        """The key a request's idempotency record is stored under, and whether the request
        is this server's own wake-up.

        Scoped by who sends it and by session: the same key in another conversation is
        another record (it never answers with that conversation's reply), and the keys of
        this server's own wake-ups live apart from every client's, so no client can claim
        one first. A wake-up proves itself with the token only this process knows.
        """
        internal = self._own_wake(request)
        return f"{'wake' if internal else 'client'}:{session_id}:{key}", internal

    def _own_wake(self, request: web.Request) -> bool:
        """The request is this server's own wake-up: it presents the token only it knows."""
        proof = request.headers.get(WAKE_TOKEN_HEADER)
        return proof is not None and same_secret(proof, self._wake_token)

    async def _session_from_header(self, request: web.Request, keyed: bool) -> str | None:
        session_id = request.headers.get(SESSION_HEADER)
        if session_id is None:
            return None
        if not keyed:
            raise ApiError(
                403,
                f"{SESSION_HEADER} is refused because no API key is configured: set "
                "API_SERVER_KEY on the server and send it as a Bearer token to continue "
                "sessions.",
                code="session_continuation_requires_key",
                param=SESSION_HEADER,
            )
        if not is_valid_session_id(session_id):
            raise ApiError(
                400, MALFORMED_SESSION_ID, code="invalid_session_id", param=SESSION_HEADER
            )
        if await asyncio.to_thread(self.store.get_session, session_id) is None:
            raise ApiError(
                404,
                f"session {session_id!r} does not exist",
                code="session_not_found",
                param=SESSION_HEADER,
            )
        request[SESSION_REQUEST_KEY] = session_id
        return session_id

    # ----------------------------------------------------------------- chat completions

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        # While draining, finished work still comes home (its wake-ups run).
        refuse_while_draining(self._is_draining() and not self._own_wake(request))
        # The header is checked before the body is read: a refused request costs nothing.
        session_id = await self._session_from_header(request, is_keyed(request))
        body = await self._read_json(request)
        check_chat_params(body)
        options = parse_chat_body(body)
        messages = options.messages
        self._check_model(options.model)
        offer, model_options = self._tools(request, body, options)
        idem_key = idempotency_key(request)
        create: SessionSource | None = None
        unwritten = False
        if session_id is None:
            # Written by the turn's own commit, not by a refused request.
            # Nothing can fail between here and ``start``, which releases the new id the
            # resolution reserves.
            conversation = await self.turns.resolve_conversation(messages, idempotency_key=idem_key)
            session_id, unwritten = conversation.session_id, conversation.unwritten
            request[SESSION_REQUEST_KEY] = session_id
            create = SessionSource(platform=Platform.API_SERVER, chat_id=session_id)
        internal = False
        if idem_key is not None:
            idem_key, internal = self._scoped_key(request, session_id, idem_key)
        turn = await self._start_turn(
            internal,
            TurnRequest(
                session_id=session_id,
                messages=messages,
                create=create,
                idempotency_key=idem_key,
                stream=options.stream,
                model_options=model_options or None,
                tool_offer=offer,
                tool_outputs=options.tool_outputs,
                # A client's key is bound to its request; a wake-up's names its delivery.
                bind_key_to_request=not internal,
                # Only this server's own wake-up proves itself (the wake token).
                wakeup=internal,
                unwritten=unwritten,
                traceparent=request.headers.get(traces.TRACEPARENT) if internal else None,
            ),
        )
        if isinstance(turn, ReplayedTurn):
            return await self._respond(request, turn.response, session_id, options, replayed=True)
        if turn.deltas is None:
            completion = await first_answer(turn.task, turn.parked)
            return json_answer(completion, {SESSION_HEADER: session_id})
        return await self._stream_turn(
            request, turn.task, turn.deltas, session_id, options, turn.parked
        )

    def _tools(
        self, request: web.Request, body: Any, options: ChatBody
    ) -> tuple[ToolOffer | None, Any]:
        """The request's tool offer (None: the server's tools as always) and its generation
        options with ``tool_choice`` in the model's names."""
        wanted = server_tools_wanted(request.headers.get(SERVER_TOOLS_HEADER))
        tools = read_tool_request(body, self.turns.tool_names(), server_tools=wanted)
        offer: ToolOffer | None = tools.offer
        if not tools.offer.client and wanted and tools.offer.allowed is None:
            offer = None
        if tools.tool_choice == options.options.tool_choice:
            return offer, options.options  # most requests: nothing to rename
        return offer, replace(options.options, tool_choice=tools.tool_choice)

    async def _start_turn(self, internal: bool, request: TurnRequest) -> Any:
        try:
            return await self.turns.start(request)
        except TurnError as exc:
            if exc.kind != "session_busy":
                raise
            if internal:
                # This server's own wake-up: a wait, not a refusal (``deliver_wake`` gives
                # the claim back without spending an attempt, and it is offered again).
                raise ApiError(
                    503,
                    exc.message,
                    type_="server_error",
                    code="session_busy",
                    headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
                ) from None
            raise ApiError(409, exc.message, code="session_busy") from None

    async def _respond(
        self,
        request: web.Request,
        completion: dict[str, Any],
        session_id: str,
        options: ChatBody,
        *,
        replayed: bool = False,
    ) -> web.StreamResponse:
        headers = {SESSION_HEADER: session_id}
        if replayed:
            headers["Idempotent-Replayed"] = "true"
        if not options.stream:
            return json_answer(completion, headers)
        response = await open_event_stream(request, headers)
        chunk = chunker(completion)
        await send_sse(response, chunk({"role": "assistant", "content": ""}))
        text = completion_text(completion)
        if text:
            await send_sse(response, chunk({"content": text}))
        await self._finish_stream(response, completion, options)
        return response

    @staticmethod
    async def _send_tool_calls(
        response: web.StreamResponse, completion: dict[str, Any], chunk: Callable[..., Any]
    ) -> None:
        """The client tool calls of ``completion`` as ``delta.tool_calls`` chunks (the call,
        then its arguments)."""
        choices = completion.get("choices") or [{}]
        calls = (choices[0].get("message") or {}).get("tool_calls") or []
        for index, call in enumerate(calls):
            function = call["function"]
            opening = {"index": index, "id": call["id"], "type": "function"}
            opening["function"] = {"name": function["name"], "arguments": ""}
            await send_sse(response, chunk({"tool_calls": [opening]}))
            arguments = {"index": index, "function": {"arguments": function["arguments"]}}
            await send_sse(response, chunk({"tool_calls": [arguments]}))

    async def _finish_stream(
        self, response: web.StreamResponse, completion: dict[str, Any], options: ChatBody
    ) -> None:
        chunk = chunker(completion)
        await self._send_tool_calls(response, completion, chunk)
        # "tool_calls" when the turn stopped for the client, "length" when the model was cut.
        await send_sse(response, chunk({}, finish_reason=finish_reason_of(completion)))
        if options.include_usage:
            usage_chunk = chunk({}, finish_reason=None)
            usage_chunk["choices"] = []
            usage_chunk["usage"] = completion.get("usage")
            await send_sse(response, usage_chunk)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()

    async def _stream_turn(
        self,
        request: web.Request,
        task: asyncio.Task[dict[str, Any]],
        deltas: asyncio.Queue[str | ToolProgress | None],
        session_id: str,
        options: ChatBody,
        parked: asyncio.Future[dict[str, Any]] | None = None,
    ) -> web.StreamResponse:
        response = await open_event_stream(request, {SESSION_HEADER: session_id})
        stream_id = "chatcmpl-" + new_token()[:24]
        created = int(time.time())

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
            return {
                "id": stream_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": self._model_name(),
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
            }

        pieces: AsyncIterator[str | ToolProgress]
        pieces = with_keepalives(deltas, response, self._keepalive_seconds)
        try:
            await send_sse(response, chunk({"role": "assistant", "content": ""}))
            async for piece in pieces:
                if isinstance(piece, ToolProgress):
                    # A named event whose data is a chunk without choices, like the usage
                    # chunk: clients that check choices pass over it.
                    tool_step = {**chunk({}), "choices": [], "reveille_tool": asdict(piece)}
                    await send_sse(response, tool_step, event=TOOL_EVENT)
                    continue
                await send_sse(response, chunk({"content": piece}))
            try:
                if parked is not None and parked.done():
                    completion = parked.result()
                    approval = {**chunk({}), "choices": []}
                    approval["reveille_approval"] = completion.get("reveille_approval")
                    await send_sse(response, approval, event=APPROVAL_EVENT)
                else:
                    completion = await asyncio.shield(task)
            except TurnError as exc:
                await send_sse(response, api_error_of(exc).body())
                await response.write(b"data: [DONE]\n\n")
                await response.write_eof()
                return response
            except Exception:
                logger.exception("streamed turn failed")
                await send_sse(
                    response, ApiError(500, "internal server error", type_="server_error").body()
                )
                await response.write(b"data: [DONE]\n\n")
                await response.write_eof()
                return response
            await self._finish_stream(
                response, {**completion, "id": stream_id, "created": created}, options
            )
        except (ConnectionResetError, ConnectionError):
            # The client went away; the turn still runs to completion and is stored.
            logger.info("client of session %s disconnected during a stream", session_id)
        return response
