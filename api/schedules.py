"""The web UI's schedule routes: the recurring schedules of web UI sessions, and cancelling
one (the session panel's list and its ✕).

``GET /api/schedules[?session=ID][&all=1]``, ``GET /api/schedules/{id}``,
``DELETE /api/schedules/{id}``; behind the web UI's login like every other route. A schedule
of another surface's session is 404 here (the API server and the CLI show those).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web

from delivery.schedules import Schedule
from delivery.schedules_engine import ScheduleEngine, ScheduleNotFound
from tools.schedule_tool import describe, installed

__all__ = ["WebSchedules"]

_MAX_ID = 200
BY_WEBUI = "the web UI"


def _error(status: int, message: str, code: str) -> web.Response:
    return web.json_response({"error": {"message": message, "code": code}}, status=status)


class WebSchedules:
    def __init__(self, engine: Callable[[], ScheduleEngine | None] = installed) -> None:
        self._engine = engine

    def add_to(self, router: web.UrlDispatcher) -> None:
        router.add_get("/api/schedules", self.list_schedules)
        router.add_get("/api/schedules/{id}", self.get_schedule)
        router.add_delete("/api/schedules/{id}", self.cancel)

    async def list_schedules(self, request: web.Request) -> web.Response:
        engine = self._engine()
        if engine is None:
            return web.json_response({"schedules": []})
        session = (request.query.get("session") or "")[:_MAX_ID] or None
        everything = request.query.get("all") in ("1", "true", "yes")

        def read() -> list[Schedule]:
            found = engine.find(session=session, include_cancelled=everything, limit=500)
            return [s for s in found if s.origin_ui_session_id]

        found = await asyncio.to_thread(read)
        return web.json_response({"schedules": [describe(s) for s in found]})

    async def _act(
        self, request: web.Request, act: Callable[[ScheduleEngine, Schedule], Schedule]
    ) -> web.Response:
        engine = self._engine()
        schedule_id = request.match_info["id"][:_MAX_ID]

        def run() -> Schedule | None:
            if engine is None:
                return None
            try:
                found = engine.get(schedule_id)
            except ScheduleNotFound:
                return None
            return act(engine, found) if found.origin_ui_session_id else None

        done = await asyncio.to_thread(run)
        if done is None:
            return _error(404, "no such schedule", "schedule_not_found")
        return web.json_response({"schedule": describe(done)})

    async def get_schedule(self, request: web.Request) -> web.Response:
        return await self._act(request, lambda _engine, s: s)

    async def cancel(self, request: web.Request) -> web.Response:
        return await self._act(request, lambda engine, s: engine.cancel(s.id, by=BY_WEBUI))
