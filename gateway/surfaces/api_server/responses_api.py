"""The Responses API routes of the API server (``/v1/responses``), over ``gateway.responses``.

``POST /v1/responses`` (JSON, or SSE with ``stream``), ``GET /v1/responses/{id}`` (with
``?stream=true&starting_after=N`` a background response's stored events after N, then the
live ones), ``POST /v1/responses/{id}/cancel``, ``DELETE /v1/responses/{id}`` and
``GET /v1/responses/{id}/input_items``. The API server's own rules apply unchanged: the
bearer key (its middleware), the Origin allow-list, JSON bodies within the size cap, the
hostile-input checks of ``request_body``, the OpenAI error shape, 503 while draining.

A response id is an unguessable capability (``resp_`` + 128 random bits): unlike a session
id, which the chat endpoint derives from a conversation's opening, nobody can name another
client's response, so ``previous_response_id`` is taken without a configured key too. On a
keyless server a response is bound to the bearer token that created it (its owner key,
``auth.owner_of``): reading, streaming, cancelling, deleting it, its input items and a
``previous_response_id`` naming it need that token again (or the internal key); for anyone
else it does not exist (404). Its idempotency keys are that owner's too.

A background create beyond the queue's caps (``[responses] max_queued_per_key`` for the
key it came with, ``max_queued`` for all) is refused with 429 ``too_many_queued`` and
``Retry-After``; nothing is stored.

``Idempotency-Key`` on the create is bound to a fingerprint of the body: a repeat answers
with the response the first request made (a background one as it stands now); another body
with the same key is refused (422); a non-background first attempt still running answers 409.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from delivery.responses_backend import ResponseRow
from gateway.http.middleware import RETRY_AFTER_SECONDS, ApiError, open_event_stream
from gateway.openai.responses_wire import (
    ResponsesRequest,
    events_of_final,
    fingerprint_of_body,
    is_response_id,
    parse_responses_body,
    sse_event,
)
from gateway.responses import PreviousNotUsable, QueueFull, ResponsesService
from gateway.surfaces.api_server.auth import bearer_token, may_see, owner_of
from gateway.surfaces.api_server.preamble import (
    IDEMPOTENCY_HEADER,
    idempotency_key,
    refuse_while_draining,
    with_keepalives,
)
from gateway.surfaces.api_server.responses_tools import check_client_tools, check_park

# What the routes take from the API server they are mounted on (as its sessions and
# approvals routes do): its JSON body reader, its model check, whether it is draining.
ReadJson = Callable[[web.Request], Awaitable[Any]]
CheckModel = Callable[[str], None]

__all__ = ["ResponsesRoutes"]

_MAX_ITEMS_PAGE = 100
_MAX_SEQ = 2**63 - 1  # the largest sequence number a store (a signed 64-bit integer) holds


def _starting_after(raw: str | None) -> int:
    """The ``starting_after`` of a stream resume: absent is -1 (from the start); otherwise
    decimal digits naming a sequence number a store can hold (0 .. 2**63 - 1), else 400."""
    if raw is None:
        return -1
    # Digits only: int() would also take "+5", " 3" and "1_000", and a number past 2**63 - 1
    # reached the store and came back as an OverflowError inside the stream.
    if not (0 < len(raw) <= 19 and raw.isascii() and raw.isdigit()) or int(raw) > _MAX_SEQ:
        raise ApiError(
            400,
            f"'starting_after' must be a sequence number: an integer from 0 to {_MAX_SEQ}",
            param="starting_after",
            code="invalid_value",
        )
    return int(raw)


def _may_see(request: web.Request, row: ResponseRow) -> bool:
    """Whether the request holds the key that created ``row`` (see the module docstring)."""
    return may_see(request, ResponsesRequest.from_json(row.request).owner)


def _not_found(response_id: str) -> ApiError:
    return ApiError(
        404, f"No response found with id {response_id!r}", code="not_found", param="response_id"
    )


def caller_of(request: web.Request) -> str:
    """Whose key a request came with, for the per-key queue cap: a digest of the bearer
    token (the key itself is never stored), or ``keyless``."""
    token = bearer_token(request)
    if token is None:
        return "keyless"
    return "key:" + hashlib.sha256(token.encode("utf-8")).hexdigest()[:24]


class _StreamSink:
    """A non-background stream's events, numbered here, on their way to the client."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._seq = -1

    def add(self, type_: str, data: dict[str, Any]) -> None:
        self._seq += 1
        self.queue.put_nowait(sse_event(type_, data, self._seq))

    async def settle(self) -> None:
        pass

    def end(self) -> None:
        self.queue.put_nowait(None)


class ResponsesRoutes:
    """The ``/v1/responses`` handlers of one API server (see the module docstring)."""

    def __init__(
        self,
        service: ResponsesService,
        *,
        read_json: ReadJson,
        check_model: CheckModel,
        is_draining: Callable[[], bool],
        keepalive_seconds: float,
    ) -> None:
        self.service = service
        self._read_json = read_json
        self._check_model = check_model
        self._is_draining = is_draining
        self._keepalive_seconds = keepalive_seconds

    def add_to(self, router: web.UrlDispatcher) -> None:
        router.add_post("/v1/responses", self._create)
        router.add_get("/v1/responses/{response_id}", self._retrieve)
        router.add_delete("/v1/responses/{response_id}", self._delete)
        router.add_post("/v1/responses/{response_id}/cancel", self._cancel)
        router.add_get("/v1/responses/{response_id}/input_items", self._input_items)

    # ----------------------------------------------------------------- create

    async def _create(self, request: web.Request) -> web.StreamResponse:
        refuse_while_draining(self._is_draining())
        body = await self._read_json(request)
        owner = owner_of(request)
        parsed = dataclasses.replace(parse_responses_body(body), owner=owner)
        self._check_model(parsed.model)
        parsed = check_client_tools(request, body, parsed, self.service.turns.tool_names())
        previous_id = parsed.previous_response_id
        previous = None
        if previous_id is not None:
            previous = await self.service.get(previous_id) if is_response_id(previous_id) else None
            if previous is not None and not _may_see(request, previous):
                raise ApiError(  # as the service says for an id it does not know
                    404,
                    f"previous response {previous_id!r} not found",
                    code="previous_response_not_found",
                    param="previous_response_id",
                )
        await check_park(self.service.turns, parsed, previous)
        key = idempotency_key(request)
        turns = self.service.turns
        if not parsed.background and turns.active_runs >= turns.max_concurrent_runs:
            raise ApiError(
                429,
                f"too many turns running (max_concurrent_runs = {turns.max_concurrent_runs}); "
                "retry shortly, or send it with background: true",
                type_="rate_limit_error",
                code="rate_limit_exceeded",
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            )
        fingerprint = fingerprint_of_body(body)
        try:
            created = await self.service.create(
                parsed,
                # Scoped to the owner key: another client's same key is another request.
                idempotency_key=(
                    (f"client:{owner}:{key}" if owner else f"client:{key}")
                    if key is not None
                    else None
                ),
                fingerprint=fingerprint,
                caller=caller_of(request),
            )
        except QueueFull as exc:
            raise ApiError(
                429,
                str(exc),
                type_="rate_limit_error",
                code="too_many_queued",
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            ) from None
        except PreviousNotUsable as exc:
            raise ApiError(
                404 if exc.missing else 409,
                str(exc),
                code="previous_response_not_found" if exc.missing else "previous_response_running",
                param="previous_response_id",
            ) from None
        row = created.row
        if created.replayed:
            return await self._replay(request, row, parsed, fingerprint)
        if row.background:
            if parsed.stream:
                return await self._follow(request, row.id, -1)
            return web.json_response(json.loads(row.body))
        if not parsed.stream:
            return web.json_response(await self.service.run_inline(row))
        return await self._stream_inline(request, row)

    async def _replay(
        self, request: web.Request, row: ResponseRow, parsed: ResponsesRequest, fingerprint: str
    ) -> web.StreamResponse:
        if row.fingerprint != fingerprint:
            raise ApiError(
                422,
                "this idempotency key was already used with a different request; use a new key",
                code="idempotency_key_reused",
                param=IDEMPOTENCY_HEADER,
            )
        headers = {"Idempotent-Replayed": "true"}
        if row.background:
            if parsed.stream:
                return await self._follow(request, row.id, -1, headers)
            return web.json_response(json.loads(row.body), headers=headers)
        if row.status == "in_progress":
            raise ApiError(
                409,
                "a request with this Idempotency-Key is still running; retry later",
                code="idempotency_in_progress",
                param=IDEMPOTENCY_HEADER,
            )
        final = json.loads(row.body)
        if not parsed.stream:
            return web.json_response(final, headers=headers)
        response = await open_event_stream(request, headers)
        for seq, (type_, data) in enumerate(events_of_final(final)):
            await response.write(sse_event(type_, data, seq))
        await response.write_eof()
        return response

    async def _stream_inline(self, request: web.Request, row: ResponseRow) -> web.StreamResponse:
        sink = _StreamSink()
        opening = json.loads(row.body)
        sink.add("response.created", {"response": opening})
        sink.add("response.in_progress", {"response": opening})
        task = asyncio.create_task(self.service.run_inline(row, sink))
        task.add_done_callback(lambda _: sink.end())
        response = await open_event_stream(request)
        keepalive = self._keepalive_seconds
        try:
            async for chunk in with_keepalives(sink.queue, response, keepalive):
                await response.write(chunk)
            await response.write_eof()
        except ConnectionError:
            pass  # the client went away; the response still runs to its end and is stored
        return response

    # ----------------------------------------------------------------- one response

    async def _row(self, request: web.Request) -> ResponseRow:
        response_id = request.match_info["response_id"]
        row = await self.service.get(response_id) if is_response_id(response_id) else None
        if row is None or not _may_see(request, row):
            raise _not_found(response_id)
        return row

    async def _retrieve(self, request: web.Request) -> web.StreamResponse:
        stream = request.query.get("stream", "false").lower()
        if stream not in ("true", "false", "1", "0"):
            raise ApiError(400, "'stream' must be true or false", param="stream")
        after = _starting_after(request.query.get("starting_after"))
        row = await self._row(request)
        if stream not in ("true", "1"):
            return web.json_response(json.loads(row.body))
        if not row.background:
            raise ApiError(
                400,
                "only background responses can be streamed again; this one was not created "
                "with background: true",
                param="stream",
                code="invalid_value",
            )
        return await self._follow(request, row.id, after)

    async def _follow(
        self,
        request: web.Request,
        response_id: str,
        after: int,
        headers: dict[str, str] | None = None,
    ) -> web.StreamResponse:
        response = await open_event_stream(request, headers)
        keepalive = self._keepalive_seconds
        try:
            async for event in self.service.follow(response_id, after, keepalive_seconds=keepalive):
                if event is None:
                    await response.write(b": keep-alive\n\n")
                else:
                    await response.write(sse_event(event.type, event.data, event.seq))
            await response.write_eof()
        except ConnectionError:
            pass  # the client went away; it can resume with starting_after
        return response

    async def _cancel(self, request: web.Request) -> web.Response:
        row = await self._row(request)
        if not row.background:
            raise ApiError(
                400,
                "only background responses can be cancelled",
                param="response_id",
                code="invalid_value",
            )
        cancelled = await self.service.cancel(row.id)
        if cancelled is None:
            raise _not_found(row.id)
        return web.json_response(json.loads(cancelled.body))

    async def _delete(self, request: web.Request) -> web.Response:
        row = await self._row(request)
        if not await self.service.delete(row.id):
            raise _not_found(row.id)
        return web.json_response({"id": row.id, "object": "response", "deleted": True})

    async def _input_items(self, request: web.Request) -> web.Response:
        query = request.query
        try:
            limit = int(query.get("limit", "20"))
        except ValueError:
            limit = 0
        if not 1 <= limit <= _MAX_ITEMS_PAGE:
            raise ApiError(
                400, f"'limit' must be an integer from 1 to {_MAX_ITEMS_PAGE}", param="limit"
            )
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise ApiError(400, "'order' must be asc or desc", param="order")
        row = await self._row(request)
        items = ResponsesRequest.from_json(row.request).input
        if order == "desc":
            items = list(reversed(items))
        after = query.get("after")
        if after is not None:
            ids = [item["id"] for item in items]
            if after not in ids:
                raise ApiError(400, f"no input item {after!r} in this response", param="after")
            items = items[ids.index(after) + 1 :]
        page = items[:limit]
        return web.json_response(
            {
                "object": "list",
                "data": page,
                "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None,
                "has_more": len(items) > limit,
            }
        )
