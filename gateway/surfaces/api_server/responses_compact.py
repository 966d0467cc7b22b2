"""``POST /v1/responses/compact`` and ``POST /v1/responses/input_tokens`` of the API server.

Both read a context the way a response would run it: the transcript of the session that
``previous_response_id`` (or ``conversation``) names, then ``instructions`` and ``input``.

* ``input_tokens`` counts it with compaction's own estimate (``estimate_tokens``:
  characters / 4 plus a few per message; no tokenizer), as ``response.input_tokens``.
* ``compact`` summarises it with the turn service's ``Compactor`` (the same model call,
  prompt, defanging and bounds as a turn's compaction) into a ``response.compaction``
  whose output is one ``compaction`` item. Its ``encrypted_content`` is the summary in
  plain text (this server has nothing to hide from the client that owns the context);
  sent back as an input item it is given to the model as a system message. Nothing is
  stored and the session is not changed: compacting stays the client's choice.

A session another key owns, or an unknown id, is 404, as for ``/v1/responses``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from agent.messages import ChatMessage
from delivery.ids import new_token
from gateway.http.middleware import ApiError
from gateway.openai.response_object import usage_object
from gateway.openai.responses_wire import ResponsesRequest, is_response_id, parse_responses_body
from gateway.responses import ResponsesService
from gateway.session import SessionGone
from gateway.surfaces.api_server.auth import may_see
from gateway.turns.compaction import estimate_tokens
from gateway.turns.conversation import message_text

__all__ = ["CompactRoutes", "SessionOf"]

ReadJson = Callable[[web.Request], Awaitable[Any]]
# The session a ``conversation`` value names for this request (404 when it may not see
# it); given by the conversations routes once mounted.
SessionOf = Callable[[web.Request, object], Awaitable[str]]


class CompactRoutes:
    """The compact and input-token handlers over a ``ResponsesService``."""

    def __init__(
        self,
        service: ResponsesService,
        *,
        read_json: ReadJson,
        check_model: Callable[[str], None],
        model_name: Callable[[], str],
        session_of: SessionOf | None = None,
    ) -> None:
        self.service = service
        self._read_json = read_json
        self._check_model = check_model
        self._model_name = model_name
        self.session_of = session_of

    def add_to(self, router: web.UrlDispatcher) -> None:
        router.add_post("/v1/responses/compact", self._compact)
        router.add_post("/v1/responses/input_tokens", self._input_tokens)

    # ----------------------------------------------------------------- the context

    async def _context(
        self, request: web.Request, body: object, *, need_model: bool
    ) -> tuple[list[Mapping[str, Any]], list[ChatMessage]]:
        """(the stored transcript rows, the request's own messages) of a body."""
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
        model = body.get("model")
        if need_model or model is not None:
            if not isinstance(model, str) or not model.strip():
                raise ApiError(
                    400,
                    "'model' is required (a non-empty string)",
                    param="model",
                    code="missing_required_parameter",
                )
            self._check_model(model)
        previous = body.get("previous_response_id")
        conversation = body.get("conversation")
        if previous is not None and conversation is not None:
            raise ApiError(
                400,
                "give 'conversation' or 'previous_response_id', not both",
                param="conversation",
                code="invalid_value",
            )
        session_id: str | None = None
        if previous is not None:
            session_id = await self._session_of_response(request, previous)
        elif conversation is not None:
            if self.session_of is None:
                raise ApiError(400, "'conversation' is not supported here", param="conversation")
            session_id = await self.session_of(request, conversation)
        messages: list[ChatMessage] = []
        if body.get("input") is not None or session_id is None:
            # The create's own checks (items, roles, parts, lone surrogates), one way.
            parsed = parse_responses_body(
                {
                    "model": self._model_name(),
                    "input": body.get("input"),
                    "instructions": body.get("instructions"),
                }
            )
            messages = parsed.messages
        elif isinstance(body.get("instructions"), str) and body["instructions"]:
            messages = [{"role": "system", "content": body["instructions"]}]
        rows = await self._transcript(session_id) if session_id is not None else []
        return rows, messages

    async def _session_of_response(self, request: web.Request, previous: object) -> str:
        row = (
            await self.service.get(previous)
            if isinstance(previous, str) and is_response_id(previous)
            else None
        )
        if row is None or not may_see(request, ResponsesRequest.from_json(row.request).owner):
            raise ApiError(
                404,
                f"previous response {previous!r} not found",
                code="previous_response_not_found",
                param="previous_response_id",
            )
        return row.session_id

    async def _transcript(self, session_id: str) -> list[Mapping[str, Any]]:
        """The live rows of the session (what its next turn's context is built from)."""
        store = self.service.turns.store
        try:
            records = await asyncio.to_thread(store.messages, session_id)
        except SessionGone:
            return []  # its first turn has not been stored yet: nothing said so far
        return [r.as_dict() for r in records if not r.archived]

    # ----------------------------------------------------------------- handlers

    async def _input_tokens(self, request: web.Request) -> web.Response:
        body = await self._read_json(request)
        rows, messages = await self._context(request, body, need_model=False)
        count = estimate_tokens([*rows, *messages])
        return web.json_response({"object": "response.input_tokens", "input_tokens": count})

    async def _compact(self, request: web.Request) -> web.Response:
        body = await self._read_json(request)
        rows, messages = await self._context(request, body, need_model=True)
        compactor = self.service.turns.compactor
        if compactor is None:
            raise ApiError(
                501,
                "compaction is not configured on this server",
                code="unsupported",
                type_="server_error",
            )
        # The request's messages after the stored rows, numbered on from them (a summary
        # records the span of rows it covers).
        last = max((int(r["id"]) for r in rows), default=0)
        every: list[Mapping[str, Any]] = [
            *rows,
            *(
                {
                    "id": last + i + 1,
                    "role": m["role"],
                    "content": message_text(m),
                    "display_kind": None,
                    "display_metadata": None,
                }
                for i, m in enumerate(messages)
            ),
        ]
        summary = await compactor.summary_of(every)
        if summary is None:
            raise ApiError(
                502,
                "the model could not summarise the conversation; try again",
                code="compaction_failed",
                type_="server_error",
            )
        input_tokens = estimate_tokens(every)
        output_tokens = estimate_tokens([summary])
        item_id = "cmp_" + new_token()[:32]
        return web.json_response(
            {
                "id": item_id,
                "object": "response.compaction",
                "created_at": int(time.time()),
                "output": [
                    {
                        "id": item_id,
                        "type": "compaction",
                        "encrypted_content": summary["content"],
                        "created_by": self._model_name(),
                    }
                ],
                "usage": usage_object(
                    {"prompt_tokens": input_tokens, "completion_tokens": output_tokens}
                ),
            }
        )
