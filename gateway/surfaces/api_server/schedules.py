"""The schedule routes of the API server: what API clients see of the recurring schedules
of their sessions, and cancelling one.

``GET /api/schedules`` lists the active and paused schedules of API-server sessions
(``?session=`` narrows it to one, ``?all=1`` adds cancelled ones), each with its next due
time in its own zone; ``GET /api/schedules/{id}`` shows one; ``DELETE /api/schedules/{id}``
cancels it (200 with ``state`` ``cancelled``; again is harmless). An unknown id, or one of
another surface's session, is 404. All need the API key (401 without one configured), like
the background routes: anyone on the machine could otherwise stop a schedule.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web

from delivery.schedules import Schedule
from delivery.schedules_engine import ScheduleEngine, ScheduleNotFound
from gateway.config import Platform
from gateway.delivery_targets import session_platform
from gateway.http.middleware import ApiError
from gateway.session import SessionStore
from tools.schedule_tool import describe, installed

__all__ = ["BY_API", "ScheduleRoutes"]

BY_API = "an API client"
_MAX_ID = 200


class ScheduleRoutes:
    """The handlers, over the session store (whose sessions are whose) and the engine."""

    def __init__(
        self,
        store: SessionStore,
        *,
        keyed: Callable[[web.Request], bool],
        engine: Callable[[], ScheduleEngine | None] = installed,
    ) -> None:
        self.store = store
        self._keyed = keyed
        self._engine = engine

    def add_to(self, router: web.UrlDispatcher) -> None:
        router.add_get("/api/schedules", self.list_schedules)
        router.add_get("/api/schedules/{schedule_id}", self.get_schedule)
        router.add_delete("/api/schedules/{schedule_id}", self.cancel)

    def _ready(self, request: web.Request) -> ScheduleEngine:
        if not self._keyed(request):
            raise ApiError(
                401,
                "schedules need the API key: set API_SERVER_KEY on the server and send it as a "
                "Bearer token (or use `reveille schedules` on the server)",
                code="invalid_api_key",
            )
        engine = self._engine()
        if engine is None:
            raise ApiError(503, "schedules are not available on this server", code="unavailable")
        return engine

    def _ours(self, schedule: Schedule) -> bool:
        if not schedule.origin_session_id:
            return False
        session = self.store.get_session(schedule.origin_session_id)
        return session is not None and session_platform(session) is Platform.API_SERVER

    async def list_schedules(self, request: web.Request) -> web.Response:
        engine = self._ready(request)
        wanted = request.query.get("session") or request.query.get("session_id") or None
        if wanted is not None and len(wanted) > _MAX_ID:
            raise ApiError(400, "session is too long", param="session")
        everything = request.query.get("all") in ("1", "true", "yes")

        def read() -> list[Schedule]:
            found = engine.find(session=wanted, include_cancelled=everything, limit=500)
            return [s for s in found if self._ours(s)]

        found = await asyncio.to_thread(read)
        return web.json_response(
            {"object": "list", "data": [{"object": "schedule", **describe(s)} for s in found]}
        )

    async def _one(self, request: web.Request, act: Callable[[Schedule], Schedule]) -> Schedule:
        engine = self._ready(request)
        schedule_id = request.match_info["schedule_id"][:_MAX_ID]

        def run() -> Schedule | None:
            try:
                found = engine.get(schedule_id)
            except ScheduleNotFound:
                return None
            return act(found) if self._ours(found) else None

        done = await asyncio.to_thread(run)
        if done is None:
            raise ApiError(
                404,
                f"no schedule {schedule_id[:80]!r} in this server's sessions",
                code="schedule_not_found",
            )
        return done

    async def get_schedule(self, request: web.Request) -> web.Response:
        found = await self._one(request, lambda s: s)
        return web.json_response({"object": "schedule", **describe(found)})

    async def cancel(self, request: web.Request) -> web.Response:
        engine = self._ready(request)
        done = await self._one(request, lambda s: engine.cancel(s.id, by=BY_API))
        return web.json_response({"object": "schedule", **describe(done)})
