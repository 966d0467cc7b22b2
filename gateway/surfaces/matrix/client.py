"""The bot's Matrix client: mautrix's ``HTTPAPI`` with every failure classified for the port.

mautrix raises ``MLimitExceeded`` for a 429 but keeps neither the body's ``retry_after_ms``
nor the ``Retry-After`` header. The session's trace hook reads a 429's body when it arrives
(aiohttp keeps it, so mautrix still parses it) and leaves the wait in a context variable of
the task that made the request, which ``call`` turns into the ``SurfaceError``'s
``retry_after``: the homeserver's own wait is honoured, never a guess (5 s only when it
named none).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
from collections.abc import Mapping
from types import SimpleNamespace

import aiohttp
from mautrix.api import HTTPAPI, Method, Path, PathBuilder
from mautrix.errors import MatrixConnectionError, MatrixRequestError

from gateway.surfaces.port import Refusal, SurfaceError

__all__ = ["DEFAULT_RETRY_AFTER", "MatrixClient", "surface_error"]

logger = logging.getLogger(__name__)

DEFAULT_RETRY_AFTER = 5.0
# The error codes of a room the bot can no longer write to (kicked, banned, left, unknown).
_GONE_CODES = frozenset({"M_FORBIDDEN", "M_NOT_FOUND", "M_UNKNOWN_ROOM"})
_retry_after: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "matrix_retry_after", default=None
)


async def _on_request_end(
    session: aiohttp.ClientSession,
    context: SimpleNamespace,
    params: aiohttp.TraceRequestEndParams,
) -> None:
    response = params.response
    if response.status != 429:
        return
    wait: float | None = None
    try:
        body = json.loads(await response.read())
        if isinstance(body, dict) and isinstance(body.get("retry_after_ms"), int | float):
            wait = float(body["retry_after_ms"]) / 1000.0
    except (ValueError, aiohttp.ClientError):
        pass
    header = response.headers.get("Retry-After")
    if wait is None and header is not None:
        with contextlib.suppress(ValueError):
            wait = float(header)
    _retry_after.set(wait)


def surface_error(exc: BaseException, retry_after: float | None = None) -> SurfaceError:
    """A failed Matrix call as the port classifies it."""
    if isinstance(exc, MatrixRequestError):
        code, status = str(exc.errcode or ""), int(exc.http_status)
        reason = f"matrix: {code or status}: {exc.message or exc}"
        if status == 429 or code == "M_LIMIT_EXCEEDED":
            wait = retry_after if retry_after is not None else DEFAULT_RETRY_AFTER
            return SurfaceError(reason, kind=Refusal.RATE_LIMITED, retry_after=wait, code=status)
        if code in _GONE_CODES or status in (403, 404):
            return SurfaceError(reason, kind=Refusal.GONE, code=status)
        if status >= 500:
            return SurfaceError(reason, kind=Refusal.TRANSIENT, code=status)
        return SurfaceError(reason, kind=Refusal.REFUSED, code=status)
    return SurfaceError(f"matrix: {exc or type(exc).__name__}", kind=Refusal.TRANSIENT)


class MatrixClient:
    """One homeserver, one access token; ``call`` raises only ``SurfaceError``."""

    def __init__(self, homeserver: str, token: str = "") -> None:
        trace = aiohttp.TraceConfig()
        trace.on_request_end.append(_on_request_end)
        self.session = aiohttp.ClientSession(trace_configs=[trace])
        self.api = HTTPAPI(
            base_url=homeserver.rstrip("/"), token=token, client_session=self.session
        )

    @property
    def v3(self) -> PathBuilder:
        return Path.v3

    async def call(
        self,
        method: Method,
        path: PathBuilder,
        content: Mapping[str, object] | None = None,
        *,
        query: Mapping[str, str] | None = None,
        timeout: float = 60.0,
    ) -> Mapping[str, object]:
        _retry_after.set(None)
        try:
            async with asyncio.timeout(timeout):
                body = await self.api.request(
                    method,
                    path,
                    dict(content) if content is not None else None,
                    query_params=query,
                )
        except MatrixRequestError as exc:
            raise surface_error(exc, _retry_after.get()) from exc
        except (MatrixConnectionError, aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise surface_error(exc) from exc
        return body if isinstance(body, Mapping) else {}

    def use_token(self, token: str) -> None:
        self.api.token = token

    async def close(self) -> None:
        await self.session.close()
