"""WebSocket mode of the Responses API: ``GET /v1/responses`` upgraded to a WebSocket.

The same port, key and Origin rules as every route: the bearer key is checked by the
port's middleware before the upgrade (a refusal is an HTTP 401 in OpenAI's error shape, no
socket is opened). A plain ``GET /v1/responses`` without the upgrade is 400.

On the socket the client sends ``response.create`` events as JSON text frames: the fields
of a ``POST /v1/responses`` body plus ``type`` (and optionally ``stream_id``, echoed on an
error). Each create is answered with the very events an SSE stream carries
(``response.created`` ... ``response.completed``), one JSON text frame each, produced by
the same code (``ResponsesRoutes.outcome_of``): a create always streams. Creates on one
socket run one after another, in the order sent.

Errors are ``error`` events (``status``, ``error``: type, code, message, param) and the
socket stays open: invalid JSON, a lone surrogate, an unknown event type, a binary frame,
a refused create (the status its POST would have had), a message over the server's body
cap (``max_body_bytes``). A message over eight times the cap is not read at all: the
socket is closed with 1009 (message too big). A client that goes away mid-response loses
only its view: the response runs to its end and is stored, as for SSE (the socket is
let go at the next keep-alive tick, or when the response's stream ends). A stopping
server closes the sockets still open with 1001 (going away).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable

from aiohttp import WSCloseCode, WSMsgType, web

from agent.messages import JSONObject
from gateway.http.middleware import ApiError
from gateway.http.request_body import DRAIN_FACTOR, parse_json_bytes
from gateway.openai.response_object import event_json
from gateway.surfaces.api_server.responses_api import ResponsesRoutes

__all__ = ["ResponsesSocket"]

_ENVELOPE = ("type", "stream_id")  # the WebSocket-only fields of a response.create


def _error_event(exc: ApiError, stream_id: object = None) -> str:
    event: JSONObject = {"type": "error", "status": exc.status, **exc.body()}
    if isinstance(stream_id, str):
        event["stream_id"] = stream_id
    return json.dumps(event, ensure_ascii=False)


class ResponsesSocket:
    """The WebSocket mode of one API server's Responses routes (see the module docstring)."""

    def __init__(
        self,
        routes: ResponsesRoutes,
        *,
        max_message_bytes: int,
        is_draining: Callable[[], bool],
        heartbeat_seconds: float,
    ) -> None:
        self._routes = routes
        self._max = max_message_bytes
        self._is_draining = is_draining
        self._heartbeat = heartbeat_seconds
        self._open: set[web.WebSocketResponse] = set()

    def install(self, app: web.Application) -> None:
        """Serve the route on ``app``; its shutdown closes the sockets still open (going
        away, 1001), so an idle client never holds a stopping server."""
        app.router.add_get("/v1/responses", self._connect)
        app.on_shutdown.append(self._close_all)

    async def _close_all(self, app: web.Application) -> None:
        for ws in list(self._open):
            with contextlib.suppress(ConnectionError):
                await ws.close(code=WSCloseCode.GOING_AWAY, message=b"the server is shutting down")

    async def _connect(self, request: web.Request) -> web.StreamResponse:
        # Past the cap, up to DRAIN_FACTOR x it, a message is read to answer it politely
        # (as an HTTP body is); beyond, aiohttp closes the socket with 1009 unread.
        ws = web.WebSocketResponse(max_msg_size=self._max * DRAIN_FACTOR, heartbeat=self._heartbeat)
        if not ws.can_prepare(request).ok:
            raise ApiError(
                400,
                "GET /v1/responses is the WebSocket mode: send it as a WebSocket upgrade "
                "(or POST /v1/responses to create a response)",
                code="websocket_required",
            )
        await ws.prepare(request)
        self._open.add(ws)
        try:
            await self._serve(request, ws)
        except ConnectionError:
            pass  # the client went away
        finally:
            self._open.discard(ws)
        return ws

    async def _serve(self, request: web.Request, ws: web.WebSocketResponse) -> None:
        async for message in ws:
            if message.type == WSMsgType.TEXT:
                await self._one(request, ws, message.data)
            elif message.type == WSMsgType.BINARY:
                refused = ApiError(
                    400, "send events as JSON text frames, not binary ones", code="invalid_frame"
                )
                await ws.send_str(_error_event(refused))

    async def _one(self, request: web.Request, ws: web.WebSocketResponse, text: str) -> None:
        """Answer one text frame: a response.create's events, or an error event."""
        stream_id: object = None
        try:
            raw = text.encode()
            if len(raw) > self._max:
                raise ApiError(
                    413,
                    f"the event is larger than this server's limit of {self._max} bytes",
                    code="request_too_large",
                )
            event = parse_json_bytes(raw)
            if not isinstance(event, dict):
                raise ApiError(400, "an event must be a JSON object", code="invalid_json")
            stream_id = event.get("stream_id")
            if event.get("type") != "response.create":
                raise ApiError(
                    400,
                    f"unknown event type {event.get('type')!r}: send response.create",
                    param="type",
                    code="unknown_event_type",
                )
            if self._is_draining():
                raise ApiError(
                    503,
                    "the server is shutting down; connect again",
                    type_="server_error",
                    code="server_draining",
                )
            body = {k: v for k, v in event.items() if k not in _ENVELOPE}
            outcome = await self._routes.outcome_of(request, {**body, "stream": True}, key=None)
        except ApiError as exc:
            await ws.send_str(_error_event(exc, stream_id))
            return
        events = outcome.events
        if events is None:  # every create streams here; kept for the type's sake
            await ws.send_str(json.dumps(outcome.body, ensure_ascii=False))
            return
        try:
            async for item in events:
                if item is not None:
                    await ws.send_str(event_json(*item))
                elif ws.closed or request.transport is None or request.transport.is_closing():
                    # A keep-alive tick (the socket's heartbeat pings on its own): nobody is
                    # reading any more; the response goes on without this view of it.
                    return
        finally:
            await events.aclose()
