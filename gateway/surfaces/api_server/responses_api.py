"""The Responses API routes of the API server (``/v1/responses``), over ``gateway.responses``.

``POST /v1/responses`` (JSON, or SSE with ``stream``), ``GET /v1/responses/{id}`` (with
``?stream=true&starting_after=N`` a background response's stored events after N, then the
live ones), ``POST /v1/responses/{id}/cancel``, ``DELETE /v1/responses/{id}`` and
``GET /v1/responses/{id}/input_items``. The API server's own rules apply unchanged: the
bearer key (its middleware), the Origin allow-list, JSON bodies within the size cap, the
hostile-input checks of ``request_body``, the OpenAI error shape, 503 while draining.

A create is one ``Outcome`` (``outcome_of``): a JSON object, or a stream of events that
the SSE route frames here and the WebSocket mode (``responses_ws``) frames as text frames,
so both carry the very same events. ``conversation`` names a conversation the caller may
use (``conversations.ConversationRoutes.session_of``, 404 otherwise).

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
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from agent.messages import JSONObject
from delivery.responses_backend import ResponseRow
from gateway.http.middleware import RETRY_AFTER_SECONDS, ApiError, open_event_stream
from gateway.openai.response_object import events_of_final, sse_event
from gateway.openai.responses_wire import (
    ResponsesRequest,
    fingerprint_of_body,
    is_response_id,
    parse_responses_body,
)
from gateway.responses import PreviousNotUsable, QueueFull, ResponsesService
from gateway.surfaces.api_server.auth import bearer_token, may_see, owner_of
from gateway.surfaces.api_server.paging import page_of
from gateway.surfaces.api_server.preamble import (
    IDEMPOTENCY_HEADER,
    idempotency_key,
    refuse_while_draining,
)
from gateway.surfaces.api_server.responses_compact import SessionOf
from gateway.surfaces.api_server.responses_tools import check_client_tools, check_park

# What the routes take from the API server they are mounted on (as its sessions and
# approvals routes do): its JSON body reader, its model check, whether it is draining.
ReadJson = Callable[[web.Request], Awaitable[Any]]
CheckModel = Callable[[str], None]

__all__ = ["ResponsesRoutes"]

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


# One stream event on its way to a client: (type, data, sequence number); None in a stream
# of them is a keep-alive tick (nothing happened for ``keepalive_seconds``).
WireEvent = tuple[str, Mapping[str, object] | str, int]
Events = AsyncGenerator[WireEvent | None, None]


@dataclass(frozen=True)
class Outcome:
    """What a create answers: one JSON object (``body``) or a stream of ``events``. The
    SSE route and the WebSocket mode (``responses_ws``) each frame it their own way."""

    body: JSONObject | None = None
    events: Events | None = None
    headers: dict[str, str] | None = None


async def _listed(events: Sequence[WireEvent]) -> Events:
    for event in events:
        yield event


class _StreamSink:
    """A non-background stream's events, numbered here, on their way to the client."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[WireEvent | None] = asyncio.Queue()
        self._seq = -1

    def add(self, type_: str, data: dict[str, Any]) -> None:
        self._seq += 1
        self.queue.put_nowait((type_, data, self._seq))

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
        session_of: SessionOf | None = None,
    ) -> None:
        self.service = service
        self._session_of = session_of
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
        outcome = await self.outcome_of(request, body, key=idempotency_key(request))
        if outcome.events is None:
            return web.json_response(outcome.body, headers=outcome.headers)
        return await self._write_sse(request, outcome.events, outcome.headers)

    async def outcome_of(self, request: web.Request, body: object, *, key: str | None) -> Outcome:
        """Create a response from ``body`` (checked here) for ``request``'s caller: its JSON
        answer, or its events when it streams. Shared by ``POST /v1/responses`` and the
        WebSocket mode; ``key`` is the create's ``Idempotency-Key``."""
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
        session_id = previous.session_id if previous is not None else None
        if parsed.conversation is not None:
            if self._session_of is None:
                raise ApiError(400, "'conversation' is not supported here", param="conversation")
            # 404 unless the caller's; its park is what function_call_output items answer
            session_id = await self._session_of(request, parsed.conversation)
        await check_park(self.service.turns, parsed, session_id)
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
            return self._replay(row, parsed, fingerprint)
        if row.background:
            if parsed.stream:
                return Outcome(events=self._followed(row.id, -1))
            return Outcome(body=json.loads(row.body))
        if not parsed.stream:
            return Outcome(body=await self.service.run_inline(row))
        return Outcome(events=self._inline_events(row))

    def _replay(self, row: ResponseRow, parsed: ResponsesRequest, fingerprint: str) -> Outcome:
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
                return Outcome(events=self._followed(row.id, -1), headers=headers)
            return Outcome(body=json.loads(row.body), headers=headers)
        if row.status == "in_progress":
            raise ApiError(
                409,
                "a request with this Idempotency-Key is still running; retry later",
                code="idempotency_in_progress",
                param=IDEMPOTENCY_HEADER,
            )
        final = json.loads(row.body)
        if not parsed.stream:
            return Outcome(body=final, headers=headers)
        told = [(t, d, seq) for seq, (t, d) in enumerate(events_of_final(final))]
        return Outcome(events=_listed(told), headers=headers)

    def _inline_events(self, row: ResponseRow) -> Events:
        """A non-background response's events as its turn runs here: started now, it runs
        to its end and is stored even if the client goes away before reading any."""
        sink = _StreamSink()
        opening = json.loads(row.body)
        sink.add("response.created", {"response": opening})
        sink.add("response.in_progress", {"response": opening})
        task = asyncio.create_task(self.service.run_inline(row, sink))
        task.add_done_callback(lambda _: sink.end())
        return self._drained(sink)

    async def _drained(self, sink: _StreamSink) -> Events:
        while True:
            try:
                event = await asyncio.wait_for(sink.queue.get(), self._keepalive_seconds)
            except TimeoutError:
                yield None
                continue
            if event is None:
                return
            yield event

    async def _followed(self, response_id: str, after: int) -> Events:
        """A background response's stored events after ``after``, then the live ones."""
        keepalive = self._keepalive_seconds
        async for event in self.service.follow(response_id, after, keepalive_seconds=keepalive):
            yield None if event is None else (event.type, event.data, event.seq)

    async def _write_sse(
        self, request: web.Request, events: Events, headers: dict[str, str] | None = None
    ) -> web.StreamResponse:
        response = await open_event_stream(request, headers)
        try:
            async for event in events:
                await response.write(b": keep-alive\n\n" if event is None else sse_event(*event))
            await response.write_eof()
        except ConnectionError:
            pass  # the client went away: a response still runs to its end and is stored
        finally:
            await events.aclose()
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
        return await self._write_sse(request, self._followed(row.id, after))

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
        row = await self._row(request)
        items = ResponsesRequest.from_json(row.request).input
        return web.json_response(page_of(items, request.query, what="input item"))
