"""The web UI's HTTP server: pages, the JSON routes and the one event stream of
``docs/webui-protocol.md``, on its own port in the ``reveille serve`` process.

It serves ``api/static/index.html`` for ``/``, ``/deliveries`` and ``/login`` and the files
under ``/static/`` from the package (a clean 404 while the front end is not there), with a
strict Content-Security-Policy and the hardening headers on every answer. Every ``/api/*``
route but ``bootstrap`` and ``login`` needs the login cookie when a password is set; every
state-changing request needs ``X-CSRF-Token``, and one that sends an ``Origin`` must come
from the web UI's own origin; without a password, only a loopback ``Host`` is answered (a
rebound DNS name is refused). Bodies are JSON only, size-capped, and checked for what JSON
allows but text cannot hold (``gateway.http.request_body``). Errors are
``{"error": {"message", "code", ...}}``. The server binds ``api.routes`` to its turns when it
starts and unbinds them when it stops. Its port has the same connection caps and read
deadlines as the API server's (``gateway.http.connection_guard``).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from aiohttp import web

from api import background_process, deliveries, routes
from api.approvals import AlreadyDecided, Approvals
from api.attachments import AttachmentError, max_image_bytes, read_images
from api.auth import (
    COOKIE_MAX_AGE_SECONDS,
    COOKIE_NAME,
    DEVICE_COOKIE_MAX_AGE_SECONDS,
    DEVICE_COOKIE_NAME,
    Auth,
    client_address,
)
from api.event_log import EventLog, LoggedEvent
from api.event_stream import stream_events
from api.export import FORMATS, export_filename, export_json, export_markdown
from api.gate import SurfaceGate
from api.schedules import WebSchedules
from api.turn_answers import TurnAccepted
from api.views import search_view, session_source, session_view, transcript_items
from api.wakeups import WebUIDeliveryTarget
from api.web_turns import Revision, WebTurns
from delivery.errors import LedgerError
from gateway.config import Platform
from gateway.http.connection_guard import ConnectionGuard, ConnectionLimits, GuardedSite
from gateway.http.middleware import (
    ApiError,
    ProtocolErrorLogger,
    error_middleware,
    host_name,
    is_loopback,
)
from gateway.http.request_body import read_json_body
from gateway.session import (
    MAX_SYSTEM_PROMPT_CHARS,
    MAX_TITLE_CHARS,
    MessageRecord,
    SessionGone,
    SessionRecord,
    SessionSource,
    SessionStore,
    SessionStoreError,
    is_valid_session_id,
    new_session_id,
    title_from_text,
)

__all__ = ["STATIC_DIR", "WebUIServer"]

logger = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parent / "static"
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src {images}; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)
# Images come only from the page's own /static/ folder and inline data: never from an API
# path (an <img src=/api/events> would hold one of the tab's connections for good) or a
# remote host. 'self' cannot name a path, so the origin is spelled out, when it is one a
# header may carry.
_HOST = re.compile(r"[A-Za-z0-9.\-]+(?::\d{1,5})?|\[[0-9A-Fa-f:.]+\](?::\d{1,5})?")
_HARDENING = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}
_JSON_CSP = "default-src 'none'; frame-ancestors 'none'"
_OPEN_ROUTES = frozenset({"/api/bootstrap", "/api/login"})
_MAX_QUERY = 200
_PAGE = 200  # transcript messages a page holds
_SEARCH_HITS = 50  # messages a search answers with
_NAMED_PER_LIST = 20  # untitled older sessions named per listing (each costs a read, a write)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _set_login_cookie(response: web.StreamResponse, cookie: str, request: web.Request) -> None:
    response.set_cookie(
        COOKIE_NAME,
        cookie,
        max_age=COOKIE_MAX_AGE_SECONDS,
        httponly=True,
        samesite="Strict",
        path="/",
        secure=request.secure,
    )


def _error(status: int, message: str, code: str, **extra: Any) -> web.Response:
    return web.json_response({"error": {"message": message, "code": code, **extra}}, status=status)


_MESSAGE_ID = re.compile(r"m([0-9]{1,18})")
_REVISIONS: tuple[tuple[str, Literal["edited", "regenerated"]], ...] = (
    ("edit_of", "edited"),
    ("regenerate_of", "regenerated"),
)


def _revision(body: dict[str, Any]) -> Revision | None:
    """``edit_of`` / ``regenerate_of`` of a message body: the last message ("m<id>", or
    "last") that the new turn replaces; None for an ordinary message."""
    for key, how in _REVISIONS:
        value = body.get(key)
        if value is None:
            continue
        if value == "last":
            return Revision(how)
        found = _MESSAGE_ID.fullmatch(value) if isinstance(value, str) else None
        if found is None:
            raise ApiError(400, f'{key} must be a message id ("m123") or "last"', code="invalid_id")
        return Revision(how, int(found.group(1)))
    return None


class WebUIServer:
    """The web UI's aiohttp application and its lifecycle (a ``gateway.run.Surface``)."""

    def __init__(
        self,
        *,
        store: SessionStore,
        turns: WebTurns,
        log: EventLog,
        approvals: Approvals,
        target: WebUIDeliveryTarget,
        host: str,
        port: int,
        password: str = "",
        api_key_set: bool = False,
        trusted_proxies: frozenset[str] = frozenset(),
        model_name: str = "",
        shell_enabled: bool = False,
        version: str = "",
        max_body_bytes: int = 1024 * 1024,
        static_dir: Path = STATIC_DIR,
        reuse_port: bool = False,
        connection_limits: ConnectionLimits | None = None,
    ) -> None:
        if not is_loopback(host) and not password:
            raise ValueError(
                f"the web UI would listen on {host} beyond loopback without a password: set "
                "REVEILLE_WEBUI_PASSWORD ([webui] password), bind 127.0.0.1, or turn the web "
                "UI off with REVEILLE_WEBUI_PORT=0"
            )
        self.store = store
        self.turns = turns
        self.log = log
        self.approvals = approvals
        self.target = target
        self.host = host
        self.port = port
        self.password = password
        # With an API key and no password, only web UI sessions (``api.gate``).
        self.gate = SurfaceGate(api_key_set=api_key_set, password_set=bool(password))
        # Peers whose X-Forwarded-For names the client a login attempt is counted for.
        self.trusted_proxies = trusted_proxies
        self.model_name = model_name
        self.shell_enabled = shell_enabled
        self.version = version
        self.max_body_bytes = max_body_bytes
        self.static_dir = static_dir
        self.reuse_port = reuse_port  # SO_REUSEPORT: one port shared by worker processes
        # Caps and deadlines of this port's connections (``connection_guard``).
        self.connections = ConnectionGuard(
            connection_limits or ConnectionLimits.for_this_process(), name="web UI"
        )
        self.auth: Auth | None = None
        self._runner: web.AppRunner | None = None

    # ----------------------------------------------------------------- lifecycle

    @property
    def url(self) -> str:
        host = self.host if ":" not in self.host else f"[{self.host}]"
        if host in ("0.0.0.0", "[::]"):
            host = "127.0.0.1"
        return f"http://{host}:{self.port}/"

    async def start(self) -> None:
        await self.log.aopen()
        try:
            self.auth = Auth(
                self.password, await self.log.secret(), epoch=await self.log.login_epoch()
            )
            self.log.watch(self._logout_elsewhere)
            loop = asyncio.get_running_loop()
            self.turns.loop = loop
            if ended := await self.turns.close_orphans():
                logger.info("ended %d turn(s) of a server that died mid-turn", ended)
            self.target.start(loop)
            app = self.build_app()
            self.connections.install(app)
            self._runner = web.AppRunner(
                app,
                access_log=None,
                shutdown_timeout=1.0,
                logger=ProtocolErrorLogger(logging.getLogger("aiohttp.server"), {}),
            )
            await self._runner.setup()
            site = GuardedSite(
                self._runner, self.connections, self.host, self.port, reuse_port=self.reuse_port
            )
            await site.start()
            self.port = site.port
            routes.bind(self.turns)
            logger.info("web UI listening on %s", self.url)
        except BaseException:
            await self.stop(0)
            raise

    async def stop(self, grace_seconds: float = 5.0) -> None:
        routes.unbind(self.turns)
        self.target.stop()
        await self.turns.drain(grace_seconds)
        await self.target.settle(grace_seconds)
        if self._runner is not None:
            self.log.end_streams()
            await self._runner.cleanup()
            self._runner = None
        self.turns.loop = None
        await self.log.aclose()

    def build_app(self) -> web.Application:
        app = web.Application(
            middlewares=[error_middleware, self._guard], client_max_size=self.max_body_bytes * 8
        )
        app.on_response_prepare.append(self._headers)
        r = app.router
        for path in ("/", "/deliveries", "/login"):
            r.add_get(path, self.page)
        r.add_get("/static/{path:.+}", self.static)
        r.add_get("/api/bootstrap", self.bootstrap)
        r.add_post("/api/login", self.login)
        r.add_post("/api/logout", self.logout)
        r.add_get("/api/sessions", self.list_sessions)
        r.add_get("/api/search", self.search)
        r.add_post("/api/sessions", self.create_session)
        r.add_get("/api/sessions/{id}", self.get_session)
        r.add_patch("/api/sessions/{id}", self.rename_session)
        r.add_delete("/api/sessions/{id}", self.delete_session)
        r.add_get("/api/sessions/{id}/items", self.older_items)
        r.add_get("/api/sessions/{id}/export", self.export_session)
        r.add_get("/api/sessions/{id}/background", self.session_background)
        r.add_post("/api/sessions/{id}/read", self.mark_read)
        r.add_post("/api/sessions/{id}/messages", self.post_message)
        r.add_post("/api/sessions/{id}/stop", self.stop_turn)
        r.add_post("/api/background/{id}/cancel", self.cancel_background)
        WebSchedules().add_to(r)
        r.add_post("/api/approvals/{id}", self.decide)
        r.add_get("/api/deliveries", self.list_deliveries)
        r.add_post("/api/deliveries/{id}/{action}", self.delivery_action)
        r.add_get("/api/events", self.events)
        return app

    # ----------------------------------------------------------------- guard and headers

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        assert self.auth is not None
        cookie = request.cookies.get(COOKIE_NAME)
        changing = request.method not in ("GET", "HEAD", "OPTIONS")
        origin = request.headers.get("Origin")
        if not self.auth.auth_required and not is_loopback(host_name(request.host)):
            # Without a password only loopback names may address it: a web page whose name
            # was rebound to 127.0.0.1 would otherwise be "same-origin".
            return _error(403, "address the web UI as 127.0.0.1 or localhost", "host_refused")
        foreign = origin is not None and origin.rstrip("/").lower() != self._own_origin(request)
        if foreign and (changing or request.path.startswith("/api/")):
            return _error(403, "requests from another web origin are refused", "origin_refused")
        needs_login = request.path.startswith("/api/") and request.path not in _OPEN_ROUTES
        if needs_login and not self.auth.logged_in(cookie):
            return _error(401, "log in first", "login_required")
        if changing and not self.auth.csrf_ok(request.headers.get("X-CSRF-Token"), cookie):
            return _error(403, "missing or wrong X-CSRF-Token", "csrf_failed")
        try:
            return await handler(request)
        except ApiError as exc:
            return _error(exc.status, exc.message, exc.code or "invalid_request")
        except SessionStoreError as exc:
            return _error(
                503, f"storage is unavailable: {exc}", "store_unavailable", retryable=True
            )

    @staticmethod
    def _page_csp(request: web.Request) -> str:
        images = "data:"
        if _HOST.fullmatch(request.host or ""):
            images = f"{request.scheme}://{request.host}/static/ data:"
        return CSP.format(images=images)

    @staticmethod
    def _own_origin(request: web.Request) -> str:
        return f"{request.scheme}://{request.host}".lower()

    async def _headers(self, request: web.Request, response: web.StreamResponse) -> None:
        for name, value in _HARDENING.items():
            response.headers.setdefault(name, value)
        content_type = response.headers.get("Content-Type", "")
        response.headers.setdefault(
            "Content-Security-Policy",
            self._page_csp(request) if content_type.startswith("text/html") else _JSON_CSP,
        )
        if request.path.startswith("/api/"):
            response.headers.setdefault("Cache-Control", "no-store")

    # ----------------------------------------------------------------- pages

    async def page(self, request: web.Request) -> web.StreamResponse:
        index = self.static_dir / "index.html"
        if not index.is_file():
            return web.Response(status=404, text="the web UI's front end is not installed\n")
        return web.FileResponse(
            index, headers={"Content-Type": "text/html; charset=utf-8", "Cache-Control": "no-cache"}
        )

    async def static(self, request: web.Request) -> web.StreamResponse:
        root = self.static_dir.resolve()
        try:
            path = (root / request.match_info["path"]).resolve()
        except (OSError, ValueError):
            raise web.HTTPNotFound() from None
        if root not in path.parents or not path.is_file():
            raise web.HTTPNotFound()
        return web.FileResponse(path)

    # ----------------------------------------------------------------- auth

    async def bootstrap(self, request: web.Request) -> web.Response:
        assert self.auth is not None
        cookie = request.cookies.get(COOKIE_NAME)
        # The page loads: a login in use gets a fresh cookie, so only an idle one lapses.
        renewed = self.auth.new_cookie() if self.auth.needs_renewal(cookie) else None
        if renewed is not None:
            cookie = renewed
        response = web.json_response(
            {
                "csrf_token": self.auth.csrf_token(cookie),
                "auth_required": self.auth.auth_required,
                "logged_in": self.auth.logged_in(cookie),
                "model": self.model_name,
                "shell_enabled": self.shell_enabled,
                "version": self.version,
                "notice": self.gate.notice,
                "max_image_bytes": max_image_bytes(self.max_body_bytes),
            }
        )
        if renewed is not None:
            _set_login_cookie(response, renewed, request)
        return response

    async def login(self, request: web.Request) -> web.Response:
        assert self.auth is not None
        address = client_address(
            request.remote, request.headers.getall("X-Forwarded-For", []), self.trusted_proxies
        )
        client = self.auth.limit_key(address, request.cookies.get(DEVICE_COOKIE_NAME))
        if not self.auth.start_attempt(client):
            return _error(429, "too many login attempts; wait a minute", "rate_limited")
        body = await self._body(request)
        if not self.auth.check_password(client, body.get("password")):
            return _error(401, "wrong password", "wrong_password")
        cookie = self.auth.new_cookie()
        response = web.json_response(
            {"logged_in": True, "csrf_token": self.auth.csrf_token(cookie)}
        )
        _set_login_cookie(response, cookie, request)
        # A known browser from now on: its attempts are no longer the address's to spend.
        response.set_cookie(
            DEVICE_COOKIE_NAME,
            self.auth.new_device_cookie(),
            max_age=DEVICE_COOKIE_MAX_AGE_SECONDS,
            httponly=True,
            samesite="Strict",
            path="/api/login",
            secure=request.secure,
        )
        return response

    async def logout(self, request: web.Request) -> web.Response:
        assert self.auth is not None
        if self.auth.auth_required and self.auth.logged_in(request.cookies.get(COOKIE_NAME)):
            # Every login made before now ends, not only this browser's cookie: a copied
            # cookie must not outlive the logout.
            self.auth.epoch = await self.log.next_login_epoch()
            # Every other server sharing the store learns it through the log, at once.
            await self.log.append("login.epoch", {"epoch": self.auth.epoch})
        response = web.json_response({"logged_in": False})
        response.del_cookie(COOKIE_NAME, path="/")
        return response

    def _logout_elsewhere(self, event: LoggedEvent) -> None:
        """A logout through another server ends this server's logins of before it too."""
        epoch = event.data.get("epoch") if event.type == "login.epoch" else None
        if self.auth is not None and isinstance(epoch, int) and epoch > self.auth.epoch:
            self.auth.epoch = epoch

    # ----------------------------------------------------------------- sessions

    async def _body(self, request: web.Request) -> dict[str, Any]:
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
        needle = request.query.get("q", "")[:_MAX_QUERY].strip().lower()
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
        text = request.query.get("q", "")[:_MAX_QUERY]

        def find() -> list[dict[str, Any]]:
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
    ) -> tuple[list[dict[str, Any]], str | None]:
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

    async def _unfinished_work(self, session_id: str) -> list[dict[str, Any]]:
        try:
            return await asyncio.to_thread(deliveries.unfinished_work, session_id)
        except LedgerError as exc:  # the strip is a courtesy: the transcript still loads
            logger.warning("could not read the background work of %s: %s", session_id, exc)
            return []

    async def cancel_background(self, request: web.Request) -> web.Response:
        """``POST /api/background/{id}/cancel``: stop a unit of a web UI session (the strip's
        ✕); 404 for an unknown id or another surface's unit."""
        outcome = await asyncio.to_thread(
            background_process.cancel_unit, request.match_info["id"][:200]
        )
        if outcome is None:
            return _error(404, "no such background work", "background_unit_not_found")
        return web.json_response(outcome.as_dict())

    async def mark_read(self, request: web.Request) -> web.Response:
        session_id = await self._shown_session(request)
        if await self.turns.session_dict(session_id) is None:
            raise ApiError(404, "Session not found", code="session_not_found")
        await self.turns.mark_read(session_id)
        return web.Response(status=204)

    async def post_message(self, request: web.Request) -> web.Response:
        session_id = self._session_id(request)
        body = await self._body(request)
        text = body.get("text")
        if not isinstance(text, str) or len(text) > self.max_body_bytes:
            text = ""
        try:
            images = read_images(body.get("images"), max_image_bytes(self.max_body_bytes))
        except AttachmentError as exc:
            raise ApiError(400, exc.message, code=exc.code) from None
        revise = _revision(body)
        answer = await self.turns.astart(session_id, text, "webui", images=images, revise=revise)
        if isinstance(answer, TurnAccepted):
            return web.json_response(answer.as_dict(), status=202)
        extra: dict[str, Any] = {}
        if answer.retryable:
            extra["retryable"] = True
        if answer.active_stream_id is not None:
            extra["active_stream_id"] = answer.active_stream_id
        return _error(answer.status, answer.error, answer.kind or "refused", **extra)

    async def stop_turn(self, request: web.Request) -> web.Response:
        session_id = await self._shown_session(request)
        return web.json_response({"stopped": await self.turns.stop(session_id)})

    async def decide(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        decision = body.get("decision")
        if decision not in ("approve", "deny"):
            raise ApiError(400, 'decision must be "approve" or "deny"', code="invalid_decision")
        approval_id = request.match_info["id"]
        if self.gate.restricted:
            asked = await asyncio.to_thread(self.store.get_approval, approval_id)
            if asked is not None:
                # Another surface's approval (an API session's, a Telegram chat's) is behind
                # the API key: not the password-less web UI's to decide.
                await self._check_shown(asked.session_id)
        try:
            approval = await self.approvals.decide(
                approval_id, decision == "approve", by="the web UI"
            )
        except KeyError:
            return _error(404, "no such approval", "approval_not_found")
        except AlreadyDecided:
            return _error(409, "this approval was already decided", "already_decided")
        return web.json_response({"approval": approval.as_dict()})

    # ----------------------------------------------------------------- deliveries

    async def list_deliveries(self, request: web.Request) -> web.Response:
        state = request.query.get("state") or None
        if state is not None and state not in deliveries.STATES:
            raise ApiError(400, "state must be pending, delivered or dropped", code="invalid_state")
        q = request.query.get("q", "")[:_MAX_QUERY]
        rows = await asyncio.to_thread(
            deliveries.list_deliveries, state, q, webui_only=self.gate.restricted
        )
        return web.json_response({"deliveries": rows, "notice": self.gate.notice})

    async def delivery_action(self, request: web.Request) -> web.Response:
        action = request.match_info["action"]
        operation = {"redeliver": deliveries.redeliver, "drop": deliveries.drop}.get(action)
        if operation is None:
            raise web.HTTPNotFound()
        delivery_id = request.match_info["id"]
        if self.gate.restricted and not await asyncio.to_thread(deliveries.of_webui, delivery_id):
            raise self.gate.refusal("this is another surface's background work")
        try:
            view = await asyncio.to_thread(operation, delivery_id)
        except deliveries.UnknownDelivery as exc:
            if exc.pruned:
                return _error(410, f"{delivery_id} was {exc.pruned}", "delivery_pruned")
            return _error(404, "no such delivery", "delivery_not_found")
        except deliveries.DeliveryConflict as exc:
            return _error(409, str(exc), "delivery_conflict")
        await self.log.append("delivery", {"delivery": view})
        return web.json_response({"delivery": view})

    # ----------------------------------------------------------------- the event stream

    async def events(self, request: web.Request) -> web.StreamResponse:
        assert self.auth is not None
        # Whose streams these are: the login, or (no password: loopback) the client address.
        login = self.auth.login_id(request.cookies.get(COOKIE_NAME))
        owner = f"login:{login}" if login else f"addr:{request.remote}"
        return await stream_events(request, self.log, owner)
