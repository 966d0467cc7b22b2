"""The sessions REST routes of the API server: list, create, read, delete, transcript.

``GET|POST /api/sessions``, ``GET|DELETE /api/sessions/{id}``,
``GET /api/sessions/{id}/messages`` (``after_id``, ``limit``). Every route needs the API
key when one is configured (the port's middleware checks it); answers that belong to a
session echo its id in ``X-Hermes-Session-Id``. The session store does the work; this
module is request parsing and answers only.

One gate per surface (``auth.visible_to``): without the key, only API sessions are
listed, and another surface's session (the web UI's, a chat platform's) or one another
owner key holds is refused (403 ``api_key_required``), never read, changed or deleted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from gateway.config import Platform
from gateway.http.middleware import SESSION_HEADER, SESSION_REQUEST_KEY, ApiError
from gateway.session import (
    MAX_TITLE_CHARS,
    SessionGone,
    SessionRecord,
    SessionSource,
    SessionStore,
    is_valid_session_id,
    new_session_id,
)
from gateway.surfaces.api_server.auth import visible_to

__all__ = ["MALFORMED_SESSION_ID", "MAX_TITLE_CHARS", "SessionRoutes", "int_query"]

MALFORMED_SESSION_ID = "malformed session id: use 1-128 characters of A-Z a-z 0-9 . _ : -"
# Routing keys (``build_session_key``) start so; a chat platform's session id is its key.
ROUTING_KEY_PREFIX = "agent:"
_SCAN_PAGE = 500  # sessions read at a time while a keyless list skips other surfaces'


def int_query(request: web.Request, name: str, default: int | None) -> int | None:
    """A whole-number query parameter >= 0; 400 for anything else."""
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw) if len(raw) <= 18 else -1  # beyond: no SQLite integer holds it
    except ValueError:
        value = -1
    if value < 0:
        raise ApiError(
            400,
            f"query parameter {name!r} must be a whole number from 0 to 10^18",
            param=name,
            code="invalid_parameter",
        )
    return value


def _not_found(session_id: str) -> ApiError:
    return ApiError(404, f"session {session_id!r} does not exist", code="session_not_found")


def _check_visible(request: web.Request, record: SessionRecord | None) -> None:
    if record is not None and not visible_to(request, record.source):
        raise ApiError(
            403,
            f"session {record.id!r} is not this client's: without API_SERVER_KEY the API "
            "server shows only the API sessions of the key that made them (configure "
            "API_SERVER_KEY and send it to see every surface's)",
            code="api_key_required",
        )


def _visible_page(
    store: SessionStore, request: web.Request, limit: int, offset: int
) -> list[SessionRecord]:
    """A page of the sessions the request may see, most recently active first."""
    page: list[SessionRecord] = []
    skip = offset
    at = 0
    while len(page) < limit:
        batch = store.list_sessions(_SCAN_PAGE, at)
        at += len(batch)
        for record in batch:
            if not visible_to(request, record.source):
                continue
            if skip:
                skip -= 1
            elif len(page) < limit:
                page.append(record)
        if len(batch) < _SCAN_PAGE:
            break
    return page


class SessionRoutes:
    """The handlers, over a store; ``read_json`` is the server's (its key check is the
    port's middleware, ``gateway.surfaces.api_server.auth``)."""

    def __init__(
        self,
        store: SessionStore,
        *,
        read_json: Callable[[web.Request], Awaitable[Any]],
    ) -> None:
        self.store = store
        self._read_json = read_json

    def add_to(self, router: web.UrlDispatcher) -> None:
        router.add_get("/api/sessions", self.list_sessions)
        router.add_post("/api/sessions", self.create_session)
        router.add_get("/api/sessions/{session_id}", self.get_session)
        router.add_delete("/api/sessions/{session_id}", self.delete_session)
        router.add_get("/api/sessions/{session_id}/messages", self.session_messages)

    async def _path_session(self, request: web.Request) -> str:
        session_id = request.match_info["session_id"]
        if not is_valid_session_id(session_id):
            raise ApiError(400, MALFORMED_SESSION_ID, code="invalid_session_id")
        request[SESSION_REQUEST_KEY] = session_id
        return session_id

    async def list_sessions(self, request: web.Request) -> web.Response:
        limit = int_query(request, "limit", 100) or 0
        offset = int_query(request, "offset", 0) or 0
        sessions = await asyncio.to_thread(
            _visible_page, self.store, request, min(limit, 1000), offset
        )
        return web.json_response({"object": "list", "data": [s.as_dict() for s in sessions]})

    async def create_session(self, request: web.Request) -> web.Response:
        body = await self._read_json(request)
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
        session_id = body.get("id")
        title = body.get("title")
        if title is not None and (not isinstance(title, str) or len(title) > MAX_TITLE_CHARS):
            raise ApiError(
                400,
                f"'title' must be a string of at most {MAX_TITLE_CHARS} characters",
                param="title",
                code="invalid_type",
            )
        if session_id is None:
            session_id = new_session_id()
        elif not isinstance(session_id, str) or not is_valid_session_id(session_id):
            raise ApiError(400, MALFORMED_SESSION_ID, param="id", code="invalid_session_id")
        elif session_id.lower().startswith(ROUTING_KEY_PREFIX):
            # The routing-key namespace is the platforms' (a Telegram chat's session id is
            # its key): created here first, a chat's session would be an API transcript,
            # and that chat's background results would never reach it.
            raise ApiError(
                403,
                f"session ids starting with {ROUTING_KEY_PREFIX!r} belong to the chat "
                "platforms and are created only by them",
                param="id",
                code="session_id_reserved",
            )
        existing = await asyncio.to_thread(self.store.get_session, session_id)
        _check_visible(request, existing)
        session = existing or await self.store.acreate_session(
            session_id,
            source=SessionSource(platform=Platform.API_SERVER, chat_id=session_id),
            title=title,
        )
        request[SESSION_REQUEST_KEY] = session_id
        return web.json_response(
            session.as_dict(),
            status=200 if existing else 201,
            headers={SESSION_HEADER: session_id},
        )

    async def get_session(self, request: web.Request) -> web.Response:
        session_id = await self._path_session(request)
        session = await asyncio.to_thread(self.store.get_session, session_id)
        if session is None:
            raise _not_found(session_id)
        _check_visible(request, session)
        return web.json_response(session.as_dict(), headers={SESSION_HEADER: session_id})

    async def delete_session(self, request: web.Request) -> web.Response:
        session_id = await self._path_session(request)
        _check_visible(request, await asyncio.to_thread(self.store.get_session, session_id))
        if not await asyncio.to_thread(self.store.delete_session, session_id):
            raise _not_found(session_id)
        return web.json_response(
            {"id": session_id, "object": "session", "deleted": True},
            headers={SESSION_HEADER: session_id},
        )

    async def session_messages(self, request: web.Request) -> web.Response:
        session_id = await self._path_session(request)
        after_id = int_query(request, "after_id", 0) or 0
        limit = int_query(request, "limit", None)
        _check_visible(request, await asyncio.to_thread(self.store.get_session, session_id))
        try:
            rows = await asyncio.to_thread(
                self.store.messages, session_id, after_id=after_id, limit=limit
            )
        except SessionGone:
            raise _not_found(session_id) from None
        return web.json_response(
            {"object": "list", "session_id": session_id, "data": [m.as_dict() for m in rows]},
            headers={SESSION_HEADER: session_id},
        )
