"""The background routes of the API server: what API clients see of their running work, and
stopping it.

``GET /api/background`` lists the queued and running units of API-server sessions (``?
session_id=`` narrows it to one), each with its step, elapsed time and last output line as
written to the store by whichever server runs it. ``POST /api/background/{id}/cancel``
stops one: 200 with ``status`` ``cancelled``, or ``already_finished`` (with the ``state`` it
ended in) for a unit that had ended or was cancelled before, so cancelling twice is
harmless. An id that is unknown, or whose unit belongs to another surface's session (the
web UI's, a Telegram chat's), is 404. Both need the API key: without one configured they
answer 401, since anyone on the machine could otherwise stop work.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from delivery.cancel import NOT_FOUND, BackgroundUnit, CancelOutcome, active_units
from gateway.config import Platform
from gateway.delivery_targets import session_platform
from gateway.http.middleware import SESSION_HEADER, ApiError
from gateway.session import SessionStore
from tools.delegation_runtime import DelegationRuntime, get_runtime

__all__ = ["BY_API", "BackgroundRoutes"]

BY_API = "an API client"
"""How the conversation's notice names a cancel made here."""
_MAX_ID = 200


class BackgroundRoutes:
    """The handlers, over the session store (whose sessions are whose) and the runtime."""

    def __init__(
        self,
        store: SessionStore,
        *,
        keyed: Callable[[web.Request], bool],
        runtime: Callable[[], DelegationRuntime] = get_runtime,
    ) -> None:
        self.store = store
        self._keyed = keyed
        self._runtime = runtime

    def add_to(self, router: web.UrlDispatcher) -> None:
        router.add_get("/api/background", self.list_units)
        router.add_post("/api/background/{unit_id}/cancel", self.cancel)

    def _require_key(self, request: web.Request) -> None:
        if not self._keyed(request):
            raise ApiError(
                401,
                "background work needs the API key: set API_SERVER_KEY on the server and send "
                "it as a Bearer token (or use `reveille background` on the server)",
                code="invalid_api_key",
            )

    def _ours(self, session_id: str | None) -> bool:
        if not session_id:
            return False
        session = self.store.get_session(session_id)
        return session is not None and session_platform(session) is Platform.API_SERVER

    async def list_units(self, request: web.Request) -> web.Response:
        self._require_key(request)
        wanted = request.query.get("session_id") or None
        if wanted is not None and len(wanted) > _MAX_ID:
            raise ApiError(400, "session_id is too long", param="session_id")

        def read() -> list[BackgroundUnit]:
            views = self._runtime().ledger.views
            units = active_units(views, time.time(), session=wanted)
            return [u for u in units if self._ours(u.origin_session_id)]

        units = await asyncio.to_thread(read)
        return web.json_response({"object": "list", "data": [_view(u) for u in units]})

    async def cancel(self, request: web.Request) -> web.Response:
        self._require_key(request)
        unit_id = request.match_info["unit_id"]
        if len(unit_id) > _MAX_ID:
            raise _unknown(unit_id[:_MAX_ID])

        def stop() -> CancelOutcome | None:
            runtime = self._runtime()
            row = runtime.ledger.get(unit_id)
            if row is None or not self._ours(row.origin_session_id):
                return None
            return runtime.cancel(unit_id, by=BY_API)

        outcome = await asyncio.to_thread(stop)
        if outcome is None or outcome.status == NOT_FOUND:
            raise _unknown(unit_id)
        body = {"object": "background.cancel", **outcome.as_dict()}
        row_session = outcome.event.get("origin_session_id") if outcome.event else None
        headers = {SESSION_HEADER: row_session} if isinstance(row_session, str) else None
        return web.json_response(body, headers=headers)


def _unknown(unit_id: str) -> ApiError:
    return ApiError(
        404,
        f"no background unit {unit_id[:80]!r} in this server's sessions",
        code="background_unit_not_found",
    )


def _view(unit: BackgroundUnit) -> dict[str, Any]:
    return {
        "id": unit.id,
        "object": "background.unit",
        "kind": unit.kind,
        "state": unit.state,
        "goal": unit.goal,
        "session_id": unit.origin_session_id,
        "started_at": unit.started_at,
        "elapsed_seconds": unit.elapsed_seconds,
        "step": unit.step,
        "last_line": unit.line,
        "progress_at": unit.progress_at,
        "due_at": unit.due_at,  # a wake-up not due yet (state "scheduled"); else null
    }
