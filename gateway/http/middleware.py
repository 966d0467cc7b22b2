"""HTTP concerns shared by Reveille's aiohttp surfaces: the OpenAI error shape, the error
middleware that maps domain failures (refused turns, an unavailable store) onto status
codes, and small request helpers.

Errors are answered as OpenAI error objects (``{"error": {message, type, param, code}}``)
so that OpenAI clients raise their usual exceptions; a session store that is locked or gone
is a 503 with ``Retry-After`` (nothing was changed), anything unexpected a 500 that names
no internals. The effective session of a request is echoed on error responses too.

The API server's port runs all of it as one middleware (``PortMiddleware``: request
metrics, the browser guard, the error shapes and the key check, in that order), since each
layer of its own costs every request a coroutine frame; other apps stack the separate
``error_middleware`` and ``BrowserGuard.middleware``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from gateway.session import SessionStoreError
from gateway.turns.service import TurnError

__all__ = [
    "OPEN_STREAM_KEY",
    "PORT_MIDDLEWARE_KEY",
    "RETRY_AFTER_SECONDS",
    "SESSION_HEADER",
    "SESSION_REQUEST_KEY",
    "ApiError",
    "BrowserGuard",
    "PortMiddleware",
    "ProtocolErrorLogger",
    "RequestObserver",
    "api_error_of",
    "error_middleware",
    "host_name",
    "is_loopback",
    "open_event_stream",
    "require_json",
]

logger = logging.getLogger(__name__)

SESSION_HEADER = "X-Hermes-Session-Id"
RETRY_AFTER_SECONDS = 1
# The effective session of a request, for echoing it on error responses too.
# (web.RequestKey from aiohttp 3.11 on; a plain string key before.)
SESSION_REQUEST_KEY: Any = (
    web.RequestKey("reveille_session_id", str)
    if hasattr(web, "RequestKey")
    else "reveille_session_id"
)


def host_name(host: str) -> str:
    """The name part of a Host header (``[::1]:8787`` -> ``::1``, ``a:1`` -> ``a``)."""
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


# Asked on every request of a keyless port with the request's Host: the few names a server
# is reached by are parsed once, not on each request.
@functools.lru_cache(maxsize=256)
def is_loopback(host: str) -> bool:
    host = (host or "").strip().strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ApiError(Exception):
    """An error answered in the OpenAI error-object shape."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.code = code
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self, session_id: str | None = None) -> web.Response:
        headers = dict(self.headers)
        if session_id:
            headers[SESSION_HEADER] = session_id
        return web.json_response(self.body(), status=self.status, headers=headers)


_HTTP_ERROR_TYPES = {
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "forbidden"),
    404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    413: ("invalid_request_error", "request_too_large"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
}


def api_error_of(exc: TurnError) -> ApiError:
    """The HTTP answer to a refused or failed turn."""
    if exc.kind in ("session_not_found", "session_deleted"):
        return ApiError(404, exc.message, code="session_not_found")
    if exc.kind == "too_many_turns":
        return ApiError(
            429,
            exc.message,
            type_="rate_limit_error",
            code="rate_limit_exceeded",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )
    if exc.kind == "key_reused":
        return ApiError(422, exc.message, code="idempotency_key_reused", param="Idempotency-Key")
    if exc.kind == "tool_calls_pending":
        return ApiError(409, exc.message, code="tool_calls_pending")
    if exc.kind in ("no_pending_tool_calls", "unknown_call_id", "missing_tool_outputs"):
        return ApiError(400, exc.message, code=exc.kind, param="messages")
    if exc.kind == "session_taken":
        return ApiError(409, exc.message, code="conversation_conflict")
    if exc.kind == "in_progress":
        return ApiError(
            409,
            "a request with this Idempotency-Key is still running; retry later",
            code="idempotency_in_progress",
            param="Idempotency-Key",
        )
    return ApiError(502, exc.message, type_="api_error", code="upstream_error")


# The SSE response of a request once its headers are sent: an error after that point must
# end the stream inside the protocol, not become a second HTTP response in the open body.
OPEN_STREAM_KEY: Any = (
    web.RequestKey("reveille_open_stream", web.StreamResponse)
    if hasattr(web, "RequestKey")
    else "reveille_open_stream"
)


async def open_event_stream(
    request: web.Request, headers: dict[str, str] | None = None
) -> web.StreamResponse:
    """Send the headers of an SSE answer (never buffered by a proxy) and mark the stream open,
    so that an error from here on ends it inside the protocol (``OPEN_STREAM_KEY``)."""
    response = web.StreamResponse(
        status=200,
        headers={
            "Content-Type": "text/event-stream; charset=utf-8",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
            **(headers or {}),
        },
    )
    await response.prepare(request)
    request[OPEN_STREAM_KEY] = response
    return response


async def _end_open_stream(response: web.StreamResponse, error: ApiError) -> web.StreamResponse:
    with contextlib.suppress(ConnectionError, RuntimeError):
        data = json.dumps(error.body(), separators=(",", ":")).encode()
        await response.write(b"data: " + data + b"\n\ndata: [DONE]\n\n")
        await response.write_eof()
    return response


def _error_of(request: web.Request, exc: Exception) -> ApiError | None:
    """The OpenAI-shaped answer to a handler's failure; None for an ``HTTPException`` below
    400 (a redirect), which is re-raised as aiohttp's own answer."""
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            return None
        type_, code = _HTTP_ERROR_TYPES.get(
            exc.status, ("invalid_request_error" if exc.status < 500 else "server_error", None)
        )
        return ApiError(exc.status, exc.reason or "error", type_=type_, code=code)
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, TurnError):
        return api_error_of(exc)
    if isinstance(exc, SessionStoreError):
        # The store is locked by another process past its timeout, closed or gone: the
        # request changed nothing and may be retried.
        logger.error("session store unavailable for %s %s: %s", request.method, request.path, exc)
        return ApiError(
            503,
            f"the session store is unavailable, nothing was changed: {exc}",
            type_="server_error",
            code="store_unavailable",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )
    logger.exception("unhandled error in %s %s", request.method, request.path)
    return ApiError(500, "internal server error", type_="server_error", code="internal_error")


async def _error_answer(request: web.Request, error: ApiError) -> web.StreamResponse:
    stream = request.get(OPEN_STREAM_KEY)
    if stream is not None:
        # Headers are out: end the stream inside the protocol instead.
        return await _end_open_stream(stream, error)
    return error.response(request.get(SESSION_REQUEST_KEY))


@web.middleware
async def error_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        error = _error_of(request, exc)
        if error is None:
            raise
    return await _error_answer(request, error)


class ProtocolErrorLogger(logging.LoggerAdapter[logging.Logger]):
    """aiohttp's server logger, with malformed requests (an oversized header, broken
    framing) logged as one line: they are the client's fault, and a traceback for each
    would let anyone flood the log."""

    def exception(self, msg: object, *args: Any, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info")
        if isinstance(exc, HttpProcessingError):
            self.logger.info("refused a malformed HTTP request: %s", exc.message[:200])
            return
        self.logger.exception(msg, *args, **kwargs)


# -- browsers ------------------------------------------------------------------------------

_CORS_ALLOW_HEADERS = "Authorization, Content-Type, Idempotency-Key, " + SESSION_HEADER
_CORS_EXPOSE_HEADERS = SESSION_HEADER + ", Idempotent-Replayed, Retry-After"
_HARDENING_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    # The API serves no HTML; should a browser render one of its answers, nothing loads.
    "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'",
}


def require_json(request: web.Request) -> None:
    """415 unless a request that has a body declares it ``application/json``."""
    if request.body_exists and request.content_type != "application/json":
        raise ApiError(
            415,
            "request bodies must be JSON: send Content-Type: application/json",
            code="unsupported_media_type",
        )


class BrowserGuard:
    """Keeps web pages the user happens to visit from driving the agent.

    A request that carries an ``Origin`` (browsers send it on cross-site requests, and on
    every POST) is refused with 403 unless the origin is allowed; CORS preflights are
    answered only for allowed origins; every answer carries the usual hardening headers.
    (Bodies are accepted only as ``application/json``, by ``require_json``: a "simple"
    cross-site request with ``text/plain`` cannot be made into a turn.) Clients that are
    not browsers send no ``Origin`` and are unaffected.
    """

    def __init__(self, allowed_origins: frozenset[str] = frozenset()) -> None:
        self.allowed = frozenset(o.rstrip("/").lower() for o in allowed_origins)

    def install(self, app: web.Application) -> None:
        app.middlewares.insert(0, self.middleware)
        app.on_response_prepare.append(self.on_prepare)

    def _origin_allowed(self, request: web.Request) -> bool:
        origin = request.headers.get("Origin")
        return origin is None or origin.rstrip("/").lower() in self.allowed

    def refusal(self, request: web.Request) -> web.StreamResponse | None:
        """The answer to a request a browser may not make (a disallowed origin), or to a
        CORS preflight; None: the request goes on."""
        if "Origin" not in request.headers and request.method != "OPTIONS":
            # Most requests (clients that are not browsers): no origin to check, no preflight.
            return None
        if not self._origin_allowed(request):
            return ApiError(
                403,
                f"requests from the web origin {request.headers['Origin']!r} are not allowed; "
                "add it to [server] cors_origins to allow it",
                code="origin_not_allowed",
            ).response()
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            if "Origin" not in request.headers:
                return ApiError(
                    400, "a CORS preflight needs an Origin", code="bad_preflight"
                ).response()
            return web.Response(
                status=204,
                headers={
                    "Access-Control-Allow-Methods": "GET, POST, DELETE, OPTIONS",
                    "Access-Control-Allow-Headers": _CORS_ALLOW_HEADERS,
                    "Access-Control-Max-Age": "600",
                },
            )
        return None

    @web.middleware
    async def middleware(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        refused = self.refusal(request)
        if refused is not None:
            return refused
        return await handler(request)

    async def on_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        headers = response.headers  # a property: read once, not once per header
        for name, value in _HARDENING_HEADERS.items():
            headers.setdefault(name, value)
        origin = request.headers.get("Origin")
        if origin is not None and self._origin_allowed(request):
            headers["Access-Control-Allow-Origin"] = origin
            headers["Access-Control-Expose-Headers"] = _CORS_EXPOSE_HEADERS
            headers["Vary"] = "Origin"


# -- one middleware for a port ---------------------------------------------------------------

# Told of every answered request: its status and how long it took (``reveille.metrics``).
RequestObserver = Callable[[web.Request, int, float], None]


class PortMiddleware:
    """A port's request pipeline as one aiohttp middleware, outermost first: the observers
    (request metrics), the browser guard, the error shapes, the authentication, then the
    handler.

    Each layer of its own would be one more coroutine frame on every request, and on a
    busy server they add up; here they are plain calls in one frame, in the order (and with
    the answers) the separate middlewares had: a browser's refusal or a preflight is
    answered before authentication; a refused key (``authenticate`` raises an ``ApiError``)
    and every handler failure are shaped by ``error_middleware``'s rules; the observers see
    the status that was answered, refusals included.
    """

    def __init__(self, guard: BrowserGuard, authenticate: Callable[[web.Request], None]) -> None:
        self._guard = guard
        self._authenticate = authenticate
        self._observers: list[RequestObserver] = []

    def install(self, app: web.Application) -> None:
        app.middlewares.append(self.middleware)
        app.on_response_prepare.append(self._guard.on_prepare)
        app[PORT_MIDDLEWARE_KEY] = self

    def observe(self, observer: RequestObserver) -> None:
        """Tell ``observer`` of every request this port answers (or fails to)."""
        self._observers.append(observer)

    @web.middleware
    async def middleware(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        started = time.perf_counter()
        status = 500
        try:
            response = self._guard.refusal(request)
            if response is None:
                try:
                    self._authenticate(request)
                    response = await handler(request)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    error = _error_of(request, exc)
                    if error is None:
                        raise
                    response = await _error_answer(request, error)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        except Exception as exc:
            status = int(getattr(exc, "status", 500) or 500)
            raise
        finally:
            if self._observers:
                elapsed = time.perf_counter() - started
                for observer in self._observers:
                    observer(request, status, elapsed)


PORT_MIDDLEWARE_KEY: Any = (
    web.AppKey("reveille_port_middleware", PortMiddleware)
    if hasattr(web, "AppKey")
    else "reveille_port_middleware"
)
