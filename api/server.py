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

This module is the route table (``build_app``), the lifecycle and the auth, turn, approval,
delivery and event handlers; the session handlers are ``api.web_sessions`` and the checks
and headers around every request ``api.web_guard``.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

from aiohttp import web

from api import background_process, deliveries, routes
from api.approvals import AlreadyDecided, Approvals
from api.attachments import AttachmentError, max_image_bytes, read_images
from api.auth import (
    COOKIE_NAME,
    DEVICE_COOKIE_MAX_AGE_SECONDS,
    DEVICE_COOKIE_NAME,
    Auth,
    client_address,
)
from api.event_log import EventLog, LoggedEvent
from api.event_stream import stream_events
from api.gate import SurfaceGate
from api.schedules import WebSchedules
from api.turn_answers import TurnAccepted
from api.wakeups import WebUIDeliveryTarget
from api.web_guard import error_response as _error
from api.web_guard import refusal, security_headers, set_login_cookie
from api.web_sessions import MAX_QUERY, SessionHandlers
from api.web_turns import Revision, WebTurns
from gateway.http.connection_guard import ConnectionGuard, ConnectionLimits, GuardedSite
from gateway.http.middleware import (
    ApiError,
    ProtocolErrorLogger,
    error_middleware,
    is_loopback,
)
from gateway.session import (
    SessionStore,
    SessionStoreError,
)

__all__ = ["STATIC_DIR", "WebUIServer"]

logger = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parent / "static"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


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


class WebUIServer(SessionHandlers):
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
        app.on_response_prepare.append(security_headers)
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
        refused = refusal(self.auth, request)
        if refused is not None:
            return refused
        try:
            return await handler(request)
        except ApiError as exc:
            return _error(exc.status, exc.message, exc.code or "invalid_request")
        except SessionStoreError as exc:
            return _error(
                503, f"storage is unavailable: {exc}", "store_unavailable", retryable=True
            )

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
            set_login_cookie(response, renewed, request)
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
        set_login_cookie(response, cookie, request)
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
        extra: dict[str, bool | str] = {}
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
        q = request.query.get("q", "")[:MAX_QUERY]
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
