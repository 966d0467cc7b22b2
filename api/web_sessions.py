"""The web UI's session routes: listing, search, create, rename, delete, a transcript page
at a time, export and the background strip, plus the body and session-id readers every web
UI handler uses (``docs/webui-protocol.md``).

A mixin of ``api.server.WebUIServer``: the server owns the route table and the lifecycle;
these handlers only read the attributes declared below.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from aiohttp import web

from agent.messages import JSONObject
from api import deliveries
from api.approvals import Approvals
from api.event_log import EventLog
from api.export import FORMATS, export_filename, export_json, export_markdown
from api.gate import SurfaceGate
from api.views import search_view, session_source, session_view, transcript_items
from api.web_turns import WebTurns
from delivery.errors import LedgerError
from gateway.config import Platform
from gateway.http.connection_guard import ConnectionGuard
from gateway.http.middleware import ApiError
from gateway.http.request_body import read_json_body
from gateway.session import (
    MAX_SYSTEM_PROMPT_CHARS,
    MAX_TITLE_CHARS,
    MessageRecord,
    SessionGone,
    SessionRecord,
    SessionSource,
    SessionStore,
    is_valid_session_id,
    new_session_id,
    title_from_text,
)

__all__ = ["MAX_QUERY", "SessionHandlers"]

logger = logging.getLogger(__name__)

MAX_QUERY = 200  # characters of a ?q= search
_PAGE = 200  # transcript messages a page holds
_SEARCH_HITS = 50  # messages a search answers with
_NAMED_PER_LIST = 20  # untitled older sessions named per listing (each costs a read, a write)


class SessionHandlers:
    """The session handlers of the web UI server (see the module docstring)."""

    store: SessionStore
    turns: WebTurns
    log: EventLog
    approvals: Approvals
    gate: SurfaceGate
    max_body_bytes: int
    connections: ConnectionGuard

    async def _body(self, request: web.Request) -> JSONObject:
        body = await read_json_body(
            request, self.max_body_bytes, timeout=self.connections.limits.body_timeout
        )
        if body is None:
            return {}
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
        return body

    def _session_id(self, request: web.Request) -> str:
        session_id = request.match_info["id"]
        if not is_valid_session_id(session_id):
            raise ApiError(404, "Session not found", code="session_not_found")
        return session_id

    async def _shown_session(self, request: web.Request) -> str:
        """The session named by the path, when the web UI may show it (``api.gate``: 403
        for another surface's while restricted); whether it exists is the handler's."""
        session_id = self._session_id(request)
        if self.gate.restricted:
            await self._check_shown(session_id)
        return session_id

    async def _check_shown(self, session_id: str) -> None:
        record = await asyncio.to_thread(self.store.get_session, session_id)
        if record is not None:
            self.gate.check(session_source(record))

    async def list_sessions(self, request: web.Request) -> web.Response:
        needle = request.query.get("q", "")[:MAX_QUERY].strip().lower()
        records = await self._name_untitled(await asyncio.to_thread(self.store.list_sessions, 500))
        unread = await self.log.unread_ids()
        busy = await asyncio.to_thread(self.store.running_turns)
        views = [
            session_view(r, unread=r.id in unread, busy=r.id in busy)
            for r in records
            if self.gate.shows(session_source(r))
        ]
        if needle:
            views = [v for v in views if needle in f"{v['title']} {v['id']} {v['source']}".lower()]
        return web.json_response({"sessions": views})

    async def _name_untitled(self, records: list[SessionRecord]) -> list[SessionRecord]:
        """API and push-platform sessions stored before they were named after their first
        message get that name now, once (kept in the store), a few per listing."""
        untitled = [
            r for r in records if not r.title and session_source(r) != Platform.WEBUI.value
        ][:_NAMED_PER_LIST]
        if not untitled:
            return records
        named: dict[str, str] = {}
        for record in untitled:
            try:
                rows = await asyncio.to_thread(self.store.messages, record.id, limit=20)
            except SessionGone:
                continue
            first = next(
                (
                    m.content
                    for m in rows
                    if m.role == "user"
                    and not m.is_delivery
                    and not (m.display_metadata or {}).get("wake")
                ),
                None,
            )
            title = title_from_text(first) if first else None
            if title and await self.store.aset_title(record.id, title, if_untitled=True):
                named[record.id] = title
        return [replace(r, title=named[r.id]) if r.id in named else r for r in records]

    async def search(self, request: web.Request) -> web.Response:
        """``GET /api/search?q=``: the newest messages holding every word of ``q`` (full-text
        search of the store), each with its session and a snippet in pieces."""
        text = request.query.get("q", "")[:MAX_QUERY]

        def find() -> list[JSONObject]:
            hits = self.store.search_messages(text, _SEARCH_HITS)
            records = {sid: self.store.get_session(sid) for sid in {h.session_id for h in hits}}
            return [
                search_view(hit, record)
                for hit in hits
                if (record := records.get(hit.session_id)) is not None
                # Another surface's messages are behind the API key (``api.gate``).
                and self.gate.shows(session_source(record))
            ]

        return web.json_response({"results": await asyncio.to_thread(find)})

    async def create_session(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        title = body.get("title")
        if title is not None and (not isinstance(title, str) or len(title) > MAX_TITLE_CHARS):
            raise ApiError(400, f"title must be text of at most {MAX_TITLE_CHARS} characters")
        session_id = new_session_id()
        source = SessionSource(platform=Platform.WEBUI, chat_id=session_id)
        await self.store.acreate_session(session_id, source=source, title=title or None)
        view = await self.turns.session_dict(session_id)
        assert view is not None
        await self.log.append("session", {"session": view})
        return web.json_response({"session": view}, status=201)

    async def _webui_session(self, request: web.Request) -> str:
        """The id of a web UI session named by the path: 404 unknown, 409 another source's
        (API and push-platform sessions are read-only here)."""
        session_id = self._session_id(request)
        view = await self.turns.session_dict(session_id)
        if view is None:
            raise ApiError(404, "Session not found", code="session_not_found")
        if not view["chat"]:
            raise ApiError(
                409, "only web UI sessions can be changed here", code="not_a_webui_session"
            )
        return session_id

    async def rename_session(self, request: web.Request) -> web.Response:
        """``PATCH /api/sessions/{id} {"title", "system_prompt"}``: rename a web UI session
        and/or set its own system prompt ("" clears it); either may be left out."""
        session_id = await self._webui_session(request)
        body = await self._body(request)
        title, prompt = body.get("title"), body.get("system_prompt")
        renaming = "title" in body or "system_prompt" not in body
        if renaming and (
            not isinstance(title, str) or not title.strip() or len(title) > MAX_TITLE_CHARS
        ):
            message = f"title must be text of 1 to {MAX_TITLE_CHARS} characters"
            raise ApiError(400, message, code="invalid_title")
        if prompt is not None and (
            not isinstance(prompt, str) or len(prompt) > MAX_SYSTEM_PROMPT_CHARS
        ):
            message = f"system_prompt must be text of at most {MAX_SYSTEM_PROMPT_CHARS} characters"
            raise ApiError(400, message, code="invalid_system_prompt")
        found = True
        if isinstance(title, str) and renaming:
            found = await self.store.aset_title(session_id, " ".join(title.split()))
        if found and "system_prompt" in body:
            found = await self.store.aset_system_prompt(session_id, prompt)
        if not found:
            raise ApiError(404, "Session not found", code="session_not_found")
        view = await self.turns.session_dict(session_id)
        if view is None:
            raise ApiError(404, "Session not found", code="session_not_found")
        await self.log.append("session", {"session": view})
        return web.json_response({"session": view})

    async def delete_session(self, request: web.Request) -> web.Response:
        """``DELETE /api/sessions/{id}``: delete a web UI session and its transcript; 409
        ``session_busy`` while a turn runs in it or a command of it waits for approval."""
        session_id = await self._webui_session(request)
        busy = await self.turns.ais_busy(session_id)
        if busy or await self.approvals.pending_for(session_id) is not None:
            raise ApiError(409, "the session is busy; stop its turn first", code="session_busy")
        await asyncio.to_thread(self.store.delete_session, session_id)
        await self.log.set_unread(session_id, False)
        await self.log.append("session.deleted", {"session_id": session_id})
        return web.Response(status=204)

    async def get_session(self, request: web.Request) -> web.Response:
        session_id = await self._shown_session(request)
        # The log position first: an event after it may already be in the answer, but none
        # before it is missing (the tab replays after ``last_event_id``).
        last_event_id = await self.log.latest_id()
        view = await self.turns.session_dict(session_id)
        if view is None:
            raise ApiError(404, "Session not found", code="session_not_found")
        items, older = await self._transcript_page(session_id, None)
        stream = self.turns.active(session_id)
        approval = await self.approvals.pending_for(session_id)
        # Background work's approvals hold no session: shown as cards, whenever the tab opens.
        unit_approvals = await self.approvals.unit_pending_for(session_id)
        return web.json_response(
            {
                "session": view,
                "background": await self._unfinished_work(session_id),
                "items": items,
                "older": older,
                "active_stream": stream.as_dict() if stream is not None else None,
                "pending_approval": approval.as_dict() if approval is not None else None,
                "unit_approvals": [a.as_dict() for a in unit_approvals],
                "last_event_id": str(last_event_id),
            }
        )

    async def older_items(self, request: web.Request) -> web.Response:
        """``GET /api/sessions/{id}/items?before=<cursor>``: the page before ``older``."""
        session_id = await self._shown_session(request)
        before = request.query.get("before", "")
        if not before.isdigit() or len(before) > 18 or int(before) < 1:
            raise ApiError(400, "before must be a message cursor", code="invalid_cursor")
        items, older = await self._transcript_page(session_id, int(before))
        return web.json_response({"items": items, "older": older})

    async def export_session(self, request: web.Request) -> web.Response:
        """``GET /api/sessions/{id}/export?format=md|json``: the whole conversation as a
        file to download (any session the web UI may show, read-only ones too)."""
        session_id = await self._shown_session(request)
        fmt = request.query.get("format", "md")
        if fmt not in FORMATS:
            raise ApiError(400, "format must be md or json", code="invalid_format")

        def read() -> tuple[SessionRecord | None, list[MessageRecord]]:
            record = self.store.get_session(session_id)
            return record, (self.store.messages(session_id) if record is not None else [])

        try:
            record, messages = await asyncio.to_thread(read)
        except SessionGone:
            record = None
        if record is None:
            raise ApiError(404, "Session not found", code="session_not_found")
        render = export_markdown if fmt == "md" else export_json
        body = await asyncio.to_thread(render, record, messages)
        name = export_filename(record, fmt)
        return web.Response(
            text=body,
            content_type=FORMATS[fmt],
            charset="utf-8",
            headers={"Content-Disposition": f'attachment; filename="{name}"'},
        )

    async def _transcript_page(
        self, session_id: str, before: int | None
    ) -> tuple[list[JSONObject], str | None]:
        """The transcript's items from its end (before the message ``before``), a page at a
        time, and the cursor of the page before it (None: this page starts the session). A
        huge transcript is never sent, nor rendered, whole."""
        try:
            rows = await asyncio.to_thread(
                self.store.latest_messages, session_id, before_id=before, limit=_PAGE + 1
            )
        except SessionGone:
            raise ApiError(404, "Session not found", code="session_not_found") from None
        older = None
        if len(rows) > _PAGE:
            # One row more than a page: there is more before. A reply stays on the page of
            # the question or wake-up it answers.
            if rows[1].role != "assistant":
                rows = rows[1:]
            older = str(rows[0].id)
        shown = {row.id for row in rows}
        steps = [
            step
            for step in await self.log.tool_steps(session_id)
            if step.message_id in shown or (step.message_id is None and before is None)
        ]
        # A running turn (on any server) shows its own message: its kept copy is hidden.
        lease = (await asyncio.to_thread(self.store.running_turns)).get(session_id)
        live = (lease.stream_id,) if lease is not None else ()
        return transcript_items(rows, steps, live), older

    async def session_background(self, request: web.Request) -> web.Response:
        session_id = await self._shown_session(request)
        if await asyncio.to_thread(self.store.get_session, session_id) is None:
            raise ApiError(404, "Session not found", code="session_not_found")
        return web.json_response({"background": await self._unfinished_work(session_id)})

    async def _unfinished_work(self, session_id: str) -> list[JSONObject]:
        try:
            return await asyncio.to_thread(deliveries.unfinished_work, session_id)
        except LedgerError as exc:  # the strip is a courtesy: the transcript still loads
            logger.warning("could not read the background work of %s: %s", session_id, exc)
            return []
