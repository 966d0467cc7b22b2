"""HTTP concerns shared by Reveille's aiohttp surfaces: the OpenAI error shape, the error
middleware that maps domain failures (refused turns, an unavailable store) onto status
codes, and small request helpers.

Errors are answered as OpenAI error objects (``{"error": {message, type, param, code}}``)
so that OpenAI clients raise their usual exceptions; a session store that is locked or gone
is a 503 with ``Retry-After`` (nothing was changed), anything unexpected a 500 that names
no internals. The effective session of a request is echoed on error responses too.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from gateway.session import SessionStoreError
from gateway.turns import TurnError

__all__ = [
    "RETRY_AFTER_SECONDS",
    "SESSION_HEADER",
    "SESSION_REQUEST_KEY",
    "ApiError",
    "api_error_of",
    "error_middleware",
    "is_loopback",
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
    if exc.kind == "in_progress":
        return ApiError(
            409,
            "a request with this Idempotency-Key is still running; retry later",
            code="idempotency_in_progress",
            param="Idempotency-Key",
        )
    return ApiError(502, exc.message, type_="api_error", code="upstream_error")


@web.middleware
async def error_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return exc.response(request.get(SESSION_REQUEST_KEY))
    except TurnError as exc:
        return api_error_of(exc).response(request.get(SESSION_REQUEST_KEY))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        type_, code = _HTTP_ERROR_TYPES.get(
            exc.status, ("invalid_request_error" if exc.status < 500 else "server_error", None)
        )
        return ApiError(exc.status, exc.reason or "error", type_=type_, code=code).response(
            request.get(SESSION_REQUEST_KEY)
        )
    except asyncio.CancelledError:
        raise
    except SessionStoreError as exc:
        # The store is locked by another process past its timeout, closed or gone: the
        # request changed nothing and may be retried.
        logger.error("session store unavailable for %s %s: %s", request.method, request.path, exc)
        return ApiError(
            503,
            f"the session store is unavailable, nothing was changed: {exc}",
            type_="server_error",
            code="store_unavailable",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        ).response(request.get(SESSION_REQUEST_KEY))
    except Exception:
        logger.exception("unhandled error in %s %s", request.method, request.path)
        return ApiError(
            500, "internal server error", type_="server_error", code="internal_error"
        ).response(request.get(SESSION_REQUEST_KEY))
