"""The OpenAI-compatible API server: the stateless platform adapter (``reveille serve``).

Streams carry content deltas as the model writes them and, as ``event: reveille.tool``
(a chunk with no choices plus ``reveille_tool``), each tool step when it starts and ends.

Routes: ``POST /v1/chat/completions`` (JSON or SSE, ``chat_completions``), ``GET /v1/models``,
``GET /v1/models/{id}``, ``GET /health``, the sessions routes of ``sessions``, with
approvals on the approvals routes of ``approvals``, running background work and its
cancel on those of ``background``, and the Responses API of
``responses_api`` once the composition root mounts it.

Approvals (``gateway.turns.gate``): a turn waiting for one answers at once with a note
naming it, plus ``reveille_approval`` (a stream: an ``event: reveille.approval`` chunk);
until it is decided a client turn in the session answers 409 ``session_busy`` and the
server's own wake-up 503 (a wait: its attempt is refunded).

Sessions. ``X-Hermes-Session-Id`` continues a stored session: refused with 403 when no API
key is configured (anyone on the machine could otherwise resume anyone's conversation),
400 for a malformed id, 404 for an unknown one. Without the header the session id is
derived from the conversation (its system prompt and first user message), so a client that
resends the whole conversation every time keeps landing in the same session. Every
response that belongs to a session echoes its id in ``X-Hermes-Session-Id``.

The turn itself (transcript, folding of delivered background results, the agent, storing
the turn with its ``Idempotency-Key`` record, the run cap) is ``gateway.turns.service``; this module
is HTTP only: authentication, body limits, validation, the OpenAI wire format and SSE.
Turns run to completion and are stored even if the client goes away meanwhile.

The adapter cannot push a turn itself (``supports_async_delivery = False``): wake-ups come
in through ``gateway.wake.deliver_wake``'s self-POST, which reads ``_host``, ``_port``,
``_api_key``, ``_wake_token`` and ``_model_name``. When no key is configured the adapter
still has a random internal key (``_api_key``) that only its own wake-ups know, so
background-process wakes work in the keyless default setup while outside clients keep the
403. ``_wake_token`` puts a wake-up's ``Idempotency-Key`` in a namespace of its own.

Idempotency records are scoped by session (``client:<session>:<key>``): a key reused in
another conversation is another record and never answers with that conversation's reply.

The port listens through a ``connection_guard.ConnectionGuard``: caps on open connections
(per port and per client address) and deadlines for request heads, idle connections and
bodies (408), so slow or numerous clients cannot take the server's descriptors.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypedDict

from aiohttp import web

from agent.loop import Agent
from gateway.adapter import BasePlatformAdapter, SendResult
from gateway.approvals import Approvals
from gateway.config import Platform
from gateway.conversations import Conversations
from gateway.http.connection_guard import ConnectionGuard, ConnectionLimits, GuardedSite
from gateway.http.middleware import (
    SESSION_HEADER,
    ApiError,
    BrowserGuard,
    PortMiddleware,
    ProtocolErrorLogger,
    is_loopback,
)
from gateway.http.request_body import DRAIN_FACTOR, read_json_body
from gateway.openai.wire import completion_object
from gateway.responses import ResponsesService
from gateway.session import SessionStore
from gateway.surfaces.api_server.approvals import ApprovalRoutes
from gateway.surfaces.api_server.auth import ApiKeyAuth, is_keyed
from gateway.surfaces.api_server.background import BackgroundRoutes
from gateway.surfaces.api_server.chat_completions import ChatCompletionsRoute
from gateway.surfaces.api_server.conversations import ConversationRoutes
from gateway.surfaces.api_server.hooks import HOOKS_PREFIX, HookRoutes
from gateway.surfaces.api_server.responses_api import ResponsesRoutes
from gateway.surfaces.api_server.responses_compact import CompactRoutes
from gateway.surfaces.api_server.responses_ws import ResponsesSocket
from gateway.surfaces.api_server.schedules import ScheduleRoutes
from gateway.surfaces.api_server.sessions import SessionRoutes
from gateway.turns.park_sweep import ParkSweep
from gateway.turns.service import (
    TurnRunner,
    TurnService,
    agent_turn_runner,
    derive_session_id,
)

__all__ = [
    "DEFAULT_KEEPALIVE_SECONDS",
    "SESSION_HEADER",
    "ApiServerAdapter",
    "TurnRunner",
    "agent_turn_runner",
    "derive_session_id",
]

logger = logging.getLogger(__name__)

_READY_TIMEOUT_SECONDS = 2.0
DEFAULT_KEEPALIVE_SECONDS = 15.0
DEFAULT_MAX_BODY_BYTES = 1024 * 1024


class ModelObject(TypedDict):
    """The one model this server serves, as ``GET /v1/models`` lists it."""

    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ApiServerAdapter(BasePlatformAdapter):
    """OpenAI-compatible HTTP surface over a turn service and the session store.

    Give it ``turns`` (the composition root's ``TurnService``), or ``agent`` /
    ``turn_runner`` and it builds its own over ``store``.
    """

    platform = Platform.API_SERVER
    supports_async_delivery = False

    def __init__(
        self,
        *,
        store: SessionStore,
        turns: TurnService | None = None,
        agent: Agent | Callable[[], Agent] | None = None,
        turn_runner: TurnRunner | None = None,
        host: str = "127.0.0.1",
        port: int = 8642,
        api_key: str = "",
        model_name: str = "reveille-demo",
        max_concurrent_runs: int = 10,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        keepalive_seconds: float = DEFAULT_KEEPALIVE_SECONDS,
        idempotency_wait_seconds: float = 300.0,
        allowed_origins: frozenset[str] = frozenset(),
        reuse_port: bool = False,
        server_secret: str | None = None,
        connection_limits: ConnectionLimits | None = None,
        approvals: Approvals | None = None,
    ) -> None:
        super().__init__()
        given = sum(x is not None for x in (turns, agent, turn_runner))
        if given != 1:
            raise TypeError("ApiServerAdapter needs exactly one of turns=, agent= or turn_runner=")
        if max_body_bytes < 1:
            raise ValueError("max_body_bytes must be at least 1")
        if keepalive_seconds <= 0:
            raise ValueError("keepalive_seconds must be positive")
        self.store = store
        self._model_name = model_name
        if turns is None:
            runner = turn_runner or agent_turn_runner(agent)  # type: ignore[arg-type]
            turns = TurnService(
                store,
                runner,
                render=self.render_completion,
                platform=Platform.API_SERVER,
                max_concurrent_runs=max_concurrent_runs,
                idempotency_wait_seconds=idempotency_wait_seconds,
                client_tool_timeout=600.0,
            )
            if isinstance(agent, Agent):
                turns.tool_names = agent.registry.names
        self.turns = turns
        # Ends client-tool parks past their deadline (``gateway.turns.park_sweep``).
        self.park_sweep = ParkSweep(turns)
        self._host = host
        self._port = int(port)
        # SO_REUSEPORT: several worker processes listen on one port, the kernel spreads
        # connections between them (``reveille serve --workers N``).
        self._reuse_port = reuse_port
        # ``server_secret``: shared by the workers of one port, whose wake-up self-POSTs land
        # on any of them; otherwise a secret of this process alone.
        secret = server_secret or secrets.token_urlsafe(32)
        self.auth = ApiKeyAuth(api_key or "", internal_key="internal-" + secret)
        # Proves a request is this server's own wake-up (``deliver_wake`` sends it).
        self._wake_token = hashlib.sha256(f"wake:{secret}".encode()).hexdigest()
        self.max_body_bytes = max_body_bytes
        self.keepalive_seconds = keepalive_seconds
        # Caps and deadlines of this port's connections (``connection_guard``); sized from
        # this process's descriptor limit unless the composition root sizes them.
        self.connections = ConnectionGuard(
            connection_limits or ConnectionLimits.for_this_process(), name="API server"
        )
        self._runner: web.AppRunner | None = None
        self._started_at = time.time()
        self.draining = False
        self.middleware = PortMiddleware(BrowserGuard(allowed_origins), self.auth.check)
        self.approvals = approvals
        self.app = self._build_app()

    def render_completion(self, result: Any) -> dict[str, Any]:
        """The ``chat.completion`` this server answers (and stores) for an agent result."""
        return completion_object(result, self._model_name)

    @property
    def max_concurrent_runs(self) -> int:
        return self.turns.max_concurrent_runs

    # ----------------------------------------------------------------- lifecycle

    def _build_app(self) -> web.Application:
        # The cap plus headroom: the handler reads up to _DRAIN_FACTOR x the cap itself to
        # answer 413 politely, then enforces max_body_bytes.
        app = web.Application(
            client_max_size=self.max_body_bytes * DRAIN_FACTOR,
        )
        ChatCompletionsRoute(
            self.turns,
            self.store,
            read_json=self._read_json,
            check_model=self._check_model,
            model_name=lambda: self._model_name,
            is_draining=lambda: self.draining,
            wake_token=self._wake_token,
            keepalive_seconds=self.keepalive_seconds,
        ).add_to(app.router)
        app.router.add_get("/v1/models", self._list_models)
        app.router.add_get("/v1/models/{model_id}", self._get_model)
        app.router.add_get("/health", self._health)
        app.router.add_get("/livez", self._livez)
        app.router.add_get("/readyz", self._readyz)
        SessionRoutes(self.store, read_json=self._read_json).add_to(app.router)
        BackgroundRoutes(self.store, keyed=is_keyed).add_to(app.router)
        ScheduleRoutes(self.store, keyed=is_keyed).add_to(app.router)
        if self.approvals is not None:
            ApprovalRoutes(self.approvals, read_json=self._read_json, keyed=is_keyed).add_to(
                app.router
            )
        # One middleware: the browser guard, then the key check inside the error shapes (a
        # refusal has the OpenAI error shape, and comes before any handler reads a body).
        self.middleware.install(app)
        return app

    def mount_responses(self, service: ResponsesService) -> None:
        """Serve the Responses API (``/v1/responses``, ``responses_api``) over ``service``,
        with its conversations (``conversations``), compact and input_tokens, and its
        WebSocket mode (``responses_ws``)."""
        conversations = ConversationRoutes(Conversations(self.store), read_json=self._read_json)
        conversations.add_to(self.app.router)
        routes = ResponsesRoutes(
            service,
            read_json=self._read_json,
            check_model=self._check_model,
            is_draining=lambda: self.draining,
            keepalive_seconds=self.keepalive_seconds,
            session_of=conversations.session_of,
        )
        routes.add_to(self.app.router)
        ResponsesSocket(
            routes,
            max_message_bytes=self.max_body_bytes,
            is_draining=lambda: self.draining,
            heartbeat_seconds=self.keepalive_seconds,
        ).install(self.app)
        CompactRoutes(
            service,
            read_json=self._read_json,
            check_model=self._check_model,
            model_name=lambda: self._model_name,
            session_of=conversations.session_of,
        ).add_to(self.app.router)

    def mount_hooks(self, hooks: HookRoutes) -> None:
        """Serve inbound events (``POST /v1/hooks/{name}``, ``hooks``): public, each hook
        verifies its own signature."""
        self.auth.public(HOOKS_PREFIX)
        hooks.add_to(self.app.router)

    def add_public_route(
        self, path: str, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> None:
        """A ``POST`` route that authenticates itself (a webhook with a secret of its own):
        served on this port without the API key."""
        self.auth.public(path)
        self.app.router.add_post(path, handler)

    @property
    def _api_key(self) -> str:
        """What the wake self-POST presents (``gateway.wake`` reads it): the configured key,
        or the internal one only this process knows."""
        return self.auth.internal_key

    @property
    def port(self) -> int:
        return self._port

    @property
    def host(self) -> str:
        return self._host

    @property
    def active_runs(self) -> int:
        return self.turns.active_runs

    async def start(self) -> None:
        if not self.auth.configured_key and not is_loopback(self._host):
            raise RuntimeError(
                f"refusing to listen on {self._host!r} without an API key: anyone who can "
                "reach it could use the agent. Set API_SERVER_KEY (or [server] api_key), "
                "or bind to 127.0.0.1."
            )
        runner = web.AppRunner(
            self.app,
            access_log=None,
            handle_signals=False,
            logger=ProtocolErrorLogger(logging.getLogger("aiohttp.server"), {}),
        )
        await runner.setup()
        site = GuardedSite(
            runner, self.connections, self._host, self._port, reuse_port=self._reuse_port
        )
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self._port = site.port
        self.park_sweep.start()
        logger.info("API server listening on http://%s:%d/v1", self._host, self._port)

    async def stop(self, *, grace_seconds: float = 10.0) -> None:
        # Turns in flight finish and store their results before the server goes away;
        # meanwhile /readyz says draining, so a load balancer sends nothing new here.
        self.draining = True
        await self.park_sweep.stop()
        await self.turns.drain(grace_seconds)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def send(
        self, chat_id: str, text: str, *, metadata: dict[str, Any] | None = None
    ) -> SendResult:
        """Always a failed result: the API server is stateless and cannot push a message;
        wake-ups go through ``deliver_wake``'s self-POST, delegation results through
        ``persist_delegation_delivery``."""
        return SendResult(
            success=False,
            error="the API server cannot push messages; clients receive results on their "
            "next turn (delivery rows) or as wake-up turns",
        )

    # ----------------------------------------------------------------- request parsing

    async def _read_json(self, request: web.Request) -> Any:
        return await read_json_body(
            request, self.max_body_bytes, timeout=self.connections.limits.body_timeout
        )

    # ----------------------------------------------------------------- models, health

    def _model_object(self) -> ModelObject:
        return {
            "id": self._model_name,
            "object": "model",
            "created": int(self._started_at),
            "owned_by": "reveille",
        }

    async def _list_models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._model_object()]})

    async def _get_model(self, request: web.Request) -> web.Response:
        model_id = request.match_info["model_id"]
        if model_id != self._model_name:
            raise self._no_such_model(model_id)
        return web.json_response(self._model_object())

    async def _livez(self, request: web.Request) -> web.Response:
        """The process is up and its event loop answers."""
        return web.json_response({"status": "ok"})

    async def _readyz(self, request: web.Request) -> web.Response:
        """Ready for new work: not draining, and the session store answers a read within
        ``_READY_TIMEOUT_SECONDS``. 503 otherwise; the reason only with the key."""
        problem = "draining" if self.draining else None
        if problem is None:
            try:
                await asyncio.wait_for(
                    asyncio.to_thread(self.store.get_session, "readyz"), _READY_TIMEOUT_SECONDS
                )
            except TimeoutError:
                problem = "storage did not answer in time"
            except Exception as exc:
                problem = f"storage unavailable: {exc}"
        if problem is None:
            return web.json_response({"status": "ready"})
        body = {"status": "draining" if self.draining else "unavailable"}
        if not self.auth.configured_key or is_keyed(request):
            body["reason"] = problem
        return web.json_response(body, status=503, headers={"Retry-After": "1"})

    def _check_model(self, model_id: str) -> None:
        if model_id != self._model_name:
            raise self._no_such_model(model_id)

    def _no_such_model(self, model_id: str) -> ApiError:
        return ApiError(
            404,
            f"The model {model_id!r} does not exist: this server serves "
            f"{self._model_name!r} (GET /v1/models)",
            code="model_not_found",
            param="model",
            type_="invalid_request_error",
        )

    async def _health(self, request: web.Request) -> web.Response:
        if self.auth.configured_key and not is_keyed(request):
            # Without the key: only that the server is up, nothing about what it runs.
            return web.json_response({"status": "ok"})
        # The process that answered: active_runs and the cap are its own, and behind
        # ``reveille serve --workers N`` each connection may reach another worker.
        return web.json_response(
            {
                "status": "ok",
                "pid": os.getpid(),
                "platform": self.platform.value,
                "model": self._model_name,
                "active_runs": self.turns.active_runs,
                "max_concurrent_runs": self.max_concurrent_runs,
                # Background responses, in their own pool (none of max_concurrent_runs).
                "background_runs": self.turns.background_runs,
            }
        )
