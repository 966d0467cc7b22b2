"""The OpenAI-compatible API server: the stateless platform adapter (``reveille serve``).

Routes: ``POST /v1/chat/completions`` (JSON or SSE), ``GET /v1/models``,
``GET /v1/models/{id}``, ``GET /health``, ``GET|POST /api/sessions``,
``GET|DELETE /api/sessions/{id}``, ``GET /api/sessions/{id}/messages``.

Sessions. ``X-Hermes-Session-Id`` continues a stored session: refused with 403 when no API
key is configured (anyone on the machine could otherwise resume anyone's conversation),
400 for a malformed id, 404 for an unknown one. Without the header the session id is
derived from the conversation (its system prompt and first user message), so a client that
resends the whole conversation every time keeps landing in the same session. Every
response that belongs to a session echoes its id in ``X-Hermes-Session-Id``.

A turn runs on the stored transcript plus the request's last user message. Delivery rows
that background work left in the session since the last turn are folded into the model's
context once, as one system message tagged ``[reveille:delivery]``. The user message and
the reply are appended in one transaction together with the ``Idempotency-Key`` record, so
a repeated key returns the first response and never starts a second turn, across a crash
too. Turns run to completion and are stored even if the client goes away meanwhile.

The adapter cannot push a turn itself (``supports_async_delivery = False``): wake-ups come
in through ``gateway.wake.deliver_wake``'s self-POST, which reads ``_host``, ``_port``,
``_api_key`` and ``_model_name``. When no key is configured the adapter still has a random
internal key (``_api_key``) that only its own wake-ups know, so background-process wakes
work in the keyless default setup while outside clients keep the 403.

The OpenAI error shape and the error middleware live in ``http_middleware``, the completion
and chunk objects and SSE framing in ``openai_wire``; this module is the adapter and its
routes.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from agent.loop import Agent
from agent.markers import WAKE_MARKER
from agent.providers.base import DeltaCallback, ProviderError
from agent.tools import ToolContext
from delivery.ids import new_token
from gateway.config import Platform
from gateway.platforms.base import BasePlatformAdapter
from gateway.platforms.http_middleware import (
    RETRY_AFTER_SECONDS,
    SESSION_HEADER,
    SESSION_REQUEST_KEY,
    ApiError,
    error_middleware,
    is_loopback,
)
from gateway.platforms.openai_wire import (
    chunker,
    completion_text,
    delivery_context_text,
    send_sse,
)
from gateway.session import (
    SessionGone,
    SessionSource,
    SessionStore,
    build_session_key,
    is_valid_session_id,
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

IDEMPOTENCY_HEADER = "Idempotency-Key"
DEFAULT_KEEPALIVE_SECONDS = 15.0
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
_MAX_IDEMPOTENCY_KEY = 255
_IDEMPOTENCY_POLL_SECONDS = 0.05
# A body only somewhat over the cap is read (and thrown away) before the 413, so that
# clients that write the whole request before reading the answer see the 413 rather than
# a reset connection. Anything bigger is refused without reading it.
_DRAIN_FACTOR = 8


# Called with the model context, the tool context and a delta callback (None unless
# streaming); returns an object with ``content`` and ``usage`` (an ``AgentResult``).
TurnRunner = Callable[[list[dict[str, Any]], ToolContext, DeltaCallback | None], Awaitable[Any]]


def agent_turn_runner(agent: Agent | Callable[[], Agent]) -> TurnRunner:
    """A turn runner over an ``Agent``, or over a factory making one per turn."""

    async def run(
        messages: list[dict[str, Any]], ctx: ToolContext, on_delta: DeltaCallback | None
    ) -> Any:
        current = agent if isinstance(agent, Agent) else agent()
        return await current.run(messages, ctx, on_delta=on_delta)

    return run


def derive_session_id(messages: list[dict[str, Any]]) -> str:
    """A stable id for a conversation: its system prompt and first user message, hashed."""
    system = [_text(m) for m in messages if m.get("role") == "system"]
    first_user = next((_text(m) for m in messages if m.get("role") == "user"), "")
    # JSON of a list keeps the parts apart: ("a", "bc") and ("ab", "c") differ.
    material = json.dumps([system, first_user], ensure_ascii=False, separators=(",", ":"))
    return "api_" + hashlib.sha256(material.encode("utf-8")).hexdigest()[:24]


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type", "text") == "text"
        )
    return ""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ApiServerAdapter(BasePlatformAdapter):
    """OpenAI-compatible HTTP surface over the session store and an agent turn runner."""

    platform = Platform.API_SERVER
    supports_async_delivery = False

    def __init__(
        self,
        *,
        store: SessionStore,
        agent: Agent | Callable[[], Agent] | None = None,
        turn_runner: TurnRunner | None = None,
        host: str = "127.0.0.1",
        port: int = 8642,
        api_key: str = "",
        model_name: str = "reveille",
        max_concurrent_runs: int = 10,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        keepalive_seconds: float = DEFAULT_KEEPALIVE_SECONDS,
        idempotency_wait_seconds: float = 300.0,
    ) -> None:
        super().__init__()
        if (agent is None) == (turn_runner is None):
            raise TypeError("ApiServerAdapter needs exactly one of agent= or turn_runner=")
        if max_concurrent_runs < 1:
            raise ValueError("max_concurrent_runs must be at least 1")
        if max_body_bytes < 1:
            raise ValueError("max_body_bytes must be at least 1")
        if keepalive_seconds <= 0:
            raise ValueError("keepalive_seconds must be positive")
        self.store = store
        self._turn_runner: TurnRunner = turn_runner or agent_turn_runner(agent)  # type: ignore[arg-type]
        self._host = host
        self._port = int(port)
        self._configured_key = api_key or ""
        # What the wake self-POST presents. Equal to the configured key when there is one;
        # otherwise a secret only this process knows (see the module docstring).
        self._api_key = self._configured_key or "internal-" + secrets.token_urlsafe(32)
        self._model_name = model_name
        self.max_concurrent_runs = max_concurrent_runs
        self.max_body_bytes = max_body_bytes
        self.keepalive_seconds = keepalive_seconds
        self.idempotency_wait_seconds = idempotency_wait_seconds
        self._boot = f"{os.getpid()}:{secrets.token_hex(8)}"
        self._active_runs = 0
        self._turn_tasks: set[asyncio.Task[Any]] = set()
        self._runner: web.AppRunner | None = None
        self._started_at = time.time()
        self.app = self._build_app()

    # ----------------------------------------------------------------- lifecycle

    def _build_app(self) -> web.Application:
        # The cap plus headroom: the handler reads up to _DRAIN_FACTOR x the cap itself to
        # answer 413 politely, then enforces max_body_bytes.
        app = web.Application(
            middlewares=[error_middleware],
            client_max_size=self.max_body_bytes * _DRAIN_FACTOR,
        )
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        app.router.add_get("/v1/models", self._list_models)
        app.router.add_get("/v1/models/{model_id}", self._get_model)
        app.router.add_get("/health", self._health)
        app.router.add_get("/api/sessions", self._list_sessions)
        app.router.add_post("/api/sessions", self._create_session)
        app.router.add_get("/api/sessions/{session_id}", self._get_session)
        app.router.add_delete("/api/sessions/{session_id}", self._delete_session)
        app.router.add_get("/api/sessions/{session_id}/messages", self._session_messages)
        return app

    @property
    def port(self) -> int:
        return self._port

    @property
    def host(self) -> str:
        return self._host

    @property
    def active_runs(self) -> int:
        return self._active_runs

    async def start(self) -> None:
        if not self._configured_key and not is_loopback(self._host):
            raise RuntimeError(
                f"refusing to listen on {self._host!r} without an API key: anyone who can "
                "reach it could use the agent. Set API_SERVER_KEY (or [server] api_key), "
                "or bind to 127.0.0.1."
            )
        runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._port)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        if self._port == 0 and sockets:
            self._port = int(sockets[0].getsockname()[1])
        logger.info("API server listening on http://%s:%d/v1", self._host, self._port)

    async def stop(self, *, grace_seconds: float = 10.0) -> None:
        # Turns in flight finish and store their results before the server goes away.
        pending = [t for t in self._turn_tasks if not t.done()]
        if pending:
            _, still = await asyncio.wait(pending, timeout=grace_seconds)
            for task in still:
                task.cancel()
            if still:
                await asyncio.gather(*still, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def send(self, chat_id: str, text: str, *, metadata: dict[str, Any] | None = None) -> Any:
        raise NotImplementedError(
            "the API server is stateless and cannot push messages; wake-ups go through "
            "gateway.wake.deliver_wake (self-POST) and delegation results through "
            "persist_delegation_delivery"
        )

    # ----------------------------------------------------------------- auth and sessions

    def _bearer(self, request: web.Request) -> str | None:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        return token.strip()

    @staticmethod
    def _same(a: str, b: str) -> bool:
        return hmac.compare_digest(a.encode("utf-8"), b.encode("utf-8"))

    def _authenticate(self, request: web.Request) -> bool:
        """Raise 401 unless authorised; True when the caller holds a key (own or internal)."""
        token = self._bearer(request)
        if self._configured_key:
            if token is None or not self._same(token, self._configured_key):
                raise ApiError(
                    401,
                    "Invalid API key. Send it as 'Authorization: Bearer <API_SERVER_KEY>'.",
                    code="invalid_api_key",
                )
            return True
        return token is not None and self._same(token, self._api_key)

    async def _session_from_header(self, request: web.Request, keyed: bool) -> str | None:
        session_id = request.headers.get(SESSION_HEADER)
        if session_id is None:
            return None
        if not keyed:
            raise ApiError(
                403,
                f"{SESSION_HEADER} is refused because no API key is configured: set "
                "API_SERVER_KEY on the server and send it as a Bearer token to continue "
                "sessions.",
                code="session_continuation_requires_key",
                param=SESSION_HEADER,
            )
        self._check_session_id(session_id)
        if await asyncio.to_thread(self.store.get_session, session_id) is None:
            raise ApiError(
                404,
                f"session {session_id!r} does not exist",
                code="session_not_found",
                param=SESSION_HEADER,
            )
        request[SESSION_REQUEST_KEY] = session_id
        return session_id

    @staticmethod
    def _check_session_id(session_id: str) -> None:
        if not is_valid_session_id(session_id):
            raise ApiError(
                400,
                "malformed session id: use 1-128 characters of A-Z a-z 0-9 . _ : -",
                code="invalid_session_id",
                param=SESSION_HEADER,
            )

    async def _create_api_session(
        self, session_id: str, title: str | None = None
    ) -> dict[str, Any]:
        source = SessionSource(platform=Platform.API_SERVER, chat_id=session_id)
        return await self.store.acreate_session(session_id, source=source, title=title)

    def _session_key(self, session_id: str) -> str:
        return build_session_key(SessionSource(platform=Platform.API_SERVER, chat_id=session_id))

    # ----------------------------------------------------------------- request parsing

    async def _read_json(self, request: web.Request) -> Any:
        length = request.content_length
        if length is not None and length > self.max_body_bytes * _DRAIN_FACTOR:
            raise self._too_large()
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise self._too_large() from None
        if len(raw) > self.max_body_bytes:
            raise self._too_large()
        try:
            return json.loads(raw) if raw else None
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError(
                400, f"request body is not valid JSON: {exc}", code="invalid_json"
            ) from None

    def _too_large(self) -> ApiError:
        return ApiError(
            413,
            f"request body exceeds the limit of {self.max_body_bytes} bytes",
            code="request_too_large",
        )

    @staticmethod
    def _validate_chat(body: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
        model = body.get("model")
        if not isinstance(model, str) or not model.strip():
            raise ApiError(
                400,
                "'model' is required (a non-empty string)",
                param="model",
                code="missing_required_parameter",
            )
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(
                400,
                "'messages' is required (a non-empty array)",
                param="messages",
                code="missing_required_parameter",
            )
        for index, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise ApiError(
                    400,
                    f"messages[{index}] must be an object with a 'role'",
                    param=f"messages[{index}]",
                    code="invalid_message",
                )
        last_user = next((m for m in reversed(messages) if m["role"] == "user"), None)
        if last_user is None:
            raise ApiError(
                400,
                "'messages' must contain a user message",
                param="messages",
                code="invalid_message",
            )
        stream = body.get("stream", False)
        if stream is not None and not isinstance(stream, bool):
            raise ApiError(400, "'stream' must be a boolean", param="stream", code="invalid_type")
        options = body.get("stream_options") or {}
        if not isinstance(options, dict):
            raise ApiError(
                400,
                "'stream_options' must be an object",
                param="stream_options",
                code="invalid_type",
            )
        return messages, {
            "stream": bool(stream),
            "include_usage": bool(options.get("include_usage")),
        }

    # ----------------------------------------------------------------- chat completions

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        keyed = self._authenticate(request)
        # The header is checked before the body is read: a refused request costs nothing.
        session_id = await self._session_from_header(request, keyed)
        body = await self._read_json(request)
        messages, options = self._validate_chat(body)
        derived = session_id is None
        if session_id is None:
            # Created by the turn itself (one store operation), not by a refused request.
            session_id = derive_session_id(messages)
            request[SESSION_REQUEST_KEY] = session_id

        idem_key = request.headers.get(IDEMPOTENCY_HEADER)
        owner: str | None = None
        if idem_key is not None:
            if not idem_key or len(idem_key) > _MAX_IDEMPOTENCY_KEY:
                raise ApiError(
                    400,
                    f"{IDEMPOTENCY_HEADER} must be 1-{_MAX_IDEMPOTENCY_KEY} characters",
                    param=IDEMPOTENCY_HEADER,
                    code="invalid_idempotency_key",
                )
            owner = f"{self._boot}:{secrets.token_hex(6)}"
            replay = await self._claim_idempotency(idem_key, owner, session_id)
            if replay is not None:
                return await self._respond(request, replay, session_id, options, replayed=True)

        if self._active_runs >= self.max_concurrent_runs:
            if idem_key is not None and owner is not None:
                await asyncio.to_thread(self.store.release_idempotent, idem_key, owner)
            raise ApiError(
                429,
                f"too many turns running (max_concurrent_runs = {self.max_concurrent_runs}); "
                "retry shortly",
                type_="rate_limit_error",
                code="rate_limit_exceeded",
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            )
        # Counted here, released by the turn itself: a client that hangs up does not free
        # a slot while its turn still runs.
        self._active_runs += 1
        deltas: asyncio.Queue[str | None] | None = asyncio.Queue() if options["stream"] else None
        try:
            # Before any answer: once the client hears back, its session exists.
            source = SessionSource(platform=Platform.API_SERVER, chat_id=session_id)
            try:
                history, taken = await self.store.abegin_turn(
                    session_id, create_with=source if derived else None
                )
            except SessionGone:
                raise ApiError(
                    404, f"session {session_id!r} does not exist", code="session_not_found"
                ) from None
            task = asyncio.create_task(
                self._run_turn(session_id, messages, history, taken, idem_key, owner, deltas)
            )
        except BaseException:
            self._active_runs -= 1
            await self._forget_claim(idem_key, owner)
            raise
        self._turn_tasks.add(task)
        task.add_done_callback(self._turn_tasks.discard)
        # The client may be gone by the time the turn fails; the error is logged, not lost.
        task.add_done_callback(_note_unawaited_failure)
        if deltas is None:
            completion = await asyncio.shield(task)
            return web.json_response(completion, headers={SESSION_HEADER: session_id})
        return await self._stream_turn(request, task, deltas, session_id, options)

    async def _claim_idempotency(
        self, key: str, owner: str, session_id: str
    ) -> dict[str, Any] | None:
        """None when this request runs the turn; the stored response when it was run before."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.idempotency_wait_seconds
        while True:
            row = await asyncio.to_thread(
                self.store.claim_idempotent,
                key,
                owner,
                session_id=session_id,
                takeover=self._owner_gone,
            )
            if row["claimed"]:
                return None
            if row["state"] == "done" and isinstance(row["response"], dict):
                return row["response"]
            if loop.time() >= deadline:
                raise ApiError(
                    409,
                    f"a request with this {IDEMPOTENCY_HEADER} is still running; retry later",
                    code="idempotency_in_progress",
                    param=IDEMPOTENCY_HEADER,
                )
            await asyncio.sleep(_IDEMPOTENCY_POLL_SECONDS)

    def _owner_gone(self, owner: str) -> bool:
        """A running idempotency claim from a previous incarnation of the server is void."""
        pid_text, _, rest = owner.partition(":")
        token = rest.partition(":")[0]
        if f"{pid_text}:{token}" == self._boot:
            return False  # ours: a request of this process is running it
        try:
            pid = int(pid_text)
        except ValueError:
            return True
        # The same pid with another boot token is a restarted server (pid 1 in containers).
        return pid == os.getpid() or not _pid_alive(pid)

    async def _run_turn(
        self,
        session_id: str,
        request_messages: list[dict[str, Any]],
        history: list[dict[str, Any]],
        taken: list[dict[str, Any]],
        idem_key: str | None,
        owner: str | None,
        deltas: asyncio.Queue[str | None] | None,
    ) -> dict[str, Any]:
        try:
            user_message = next(m for m in reversed(request_messages) if m["role"] == "user")
            context = self._build_context(history, taken, request_messages, user_message)
            ctx = ToolContext(
                session_id=session_id,
                session_key=self._session_key(session_id),
                platform=Platform.API_SERVER.value,
            )
            on_delta: DeltaCallback | None = None
            if deltas is not None:

                async def on_delta(piece: str) -> None:
                    deltas.put_nowait(piece)

            result = await self._turn_runner(context, ctx, on_delta)
            completion = self._completion_object(result)
            user_text = _text(user_message)
            user_row: dict[str, Any] = {"role": "user", "content": user_text}
            if user_text.startswith(WAKE_MARKER):
                user_row["display_metadata"] = {"wake": True}
            reply_row: dict[str, Any] = {
                "role": "assistant",
                "content": completion_text(completion),
            }
            if idem_key is not None:
                # The dedupe keys make a turn stored twice (never expected) show up once.
                user_row["dedupe_key"] = f"idem:{idem_key}:user"
                reply_row["dedupe_key"] = f"idem:{idem_key}:assistant"
            try:
                await self.store.aappend_turn(
                    session_id,
                    [user_row, reply_row],
                    idempotency_key=idem_key,
                    # stored only to answer a repeated Idempotency-Key
                    response=completion if idem_key is not None else None,
                )
            except SessionGone:
                raise ApiError(
                    404,
                    f"session {session_id!r} was deleted while the turn ran",
                    code="session_not_found",
                ) from None
            return completion
        except ProviderError as exc:
            await self._forget_claim(idem_key, owner)
            raise ApiError(
                502,
                f"the model provider failed: {exc}",
                type_="api_error",
                code="upstream_error",
            ) from exc
        except BaseException:
            await self._forget_claim(idem_key, owner)
            raise
        finally:
            self._active_runs -= 1
            if deltas is not None:
                deltas.put_nowait(None)

    async def _forget_claim(self, key: str | None, owner: str | None) -> None:
        if key is None or owner is None:
            return
        try:
            await asyncio.to_thread(self.store.release_idempotent, key, owner)
        except Exception:
            logger.exception("could not release idempotency key %r", key)

    @staticmethod
    def _build_context(
        history: list[dict[str, Any]],
        taken: list[dict[str, Any]],
        request_messages: list[dict[str, Any]],
        user_message: dict[str, Any],
    ) -> list[dict[str, Any]]:
        """The model's context: request system prompt, stored transcript, the new message.

        Delivery rows are folded here: the rows this turn took (``abegin_turn``) go into one
        system message tagged ``[reveille:delivery]`` right before the new user message;
        rows folded by earlier turns stay in the history at their place (each once,
        consecutive ones merged). Rows that arrive after the take wait for the next turn.
        """
        taken_ids = {row["id"] for row in taken}
        context: list[dict[str, Any]] = [
            {"role": "system", "content": _text(m)}
            for m in request_messages
            if m["role"] in ("system", "developer") and _text(m)
        ]
        if history:
            earlier: list[str] = []

            def flush() -> None:
                if earlier:
                    context.append({"role": "system", "content": delivery_context_text(earlier)})
                    earlier.clear()

            for row in history:
                if row["display_kind"] is not None:
                    # Folded by an earlier turn: history, in its place. Taken just now
                    # (or not yet foldable): not here.
                    if row["folded"] and row["id"] not in taken_ids:
                        earlier.append(row["content"])
                    continue
                flush()
                context.append({"role": row["role"], "content": row["content"]})
            flush()
        else:
            # A new session: the client's own earlier messages are the history.
            last = max(i for i, m in enumerate(request_messages) if m is user_message)
            context.extend(
                {"role": m["role"], "content": _text(m)}
                for m in request_messages[:last]
                if m["role"] in ("user", "assistant")
            )
        if taken:
            # What arrived since the last turn, right before the new message: this turn is
            # the one that tells the model about it.
            context.append(
                {
                    "role": "system",
                    "content": delivery_context_text([row["content"] for row in taken]),
                }
            )
        context.append({"role": "user", "content": _text(user_message)})
        return context

    def _completion_object(self, result: Any) -> dict[str, Any]:
        usage = dict(getattr(result, "usage", None) or {})
        usage = {
            "prompt_tokens": int(usage.get("prompt_tokens", 0) or 0),
            "completion_tokens": int(usage.get("completion_tokens", 0) or 0),
            "total_tokens": int(usage.get("total_tokens", 0) or 0),
        }
        return {
            "id": "chatcmpl-" + new_token()[:24],
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self._model_name,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": str(result.content or "")},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
            ],
            "usage": usage,
        }

    async def _respond(
        self,
        request: web.Request,
        completion: dict[str, Any],
        session_id: str,
        options: dict[str, Any],
        *,
        replayed: bool = False,
    ) -> web.StreamResponse:
        headers = {SESSION_HEADER: session_id}
        if replayed:
            headers["Idempotent-Replayed"] = "true"
        if not options["stream"]:
            return web.json_response(completion, headers=headers)
        response = await self._open_stream(request, headers)
        chunk = chunker(completion)
        await send_sse(response, chunk({"role": "assistant", "content": ""}))
        text = completion_text(completion)
        if text:
            await send_sse(response, chunk({"content": text}))
        await self._finish_stream(response, completion, options)
        return response

    async def _open_stream(
        self, request: web.Request, headers: dict[str, str]
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            status=200,
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
                **headers,
            },
        )
        await response.prepare(request)
        return response

    async def _finish_stream(
        self, response: web.StreamResponse, completion: dict[str, Any], options: dict[str, Any]
    ) -> None:
        chunk = chunker(completion)
        await send_sse(response, chunk({}, finish_reason="stop"))
        if options["include_usage"]:
            usage_chunk = chunk({}, finish_reason=None)
            usage_chunk["choices"] = []
            usage_chunk["usage"] = completion.get("usage")
            await send_sse(response, usage_chunk)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()

    async def _stream_turn(
        self,
        request: web.Request,
        task: asyncio.Task[dict[str, Any]],
        deltas: asyncio.Queue[str | None],
        session_id: str,
        options: dict[str, Any],
    ) -> web.StreamResponse:
        response = await self._open_stream(request, {SESSION_HEADER: session_id})
        stream_id = "chatcmpl-" + new_token()[:24]
        created = int(time.time())

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
            return {
                "id": stream_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": self._model_name,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
            }

        try:
            await send_sse(response, chunk({"role": "assistant", "content": ""}))
            while True:
                try:
                    piece = await asyncio.wait_for(deltas.get(), self.keepalive_seconds)
                except TimeoutError:
                    await response.write(b": keep-alive\n\n")
                    continue
                if piece is None:
                    break
                await send_sse(response, chunk({"content": piece}))
            try:
                completion = await asyncio.shield(task)
            except ApiError as exc:
                await send_sse(response, exc.body())
                await response.write(b"data: [DONE]\n\n")
                await response.write_eof()
                return response
            except Exception:
                logger.exception("streamed turn failed")
                await send_sse(
                    response, ApiError(500, "internal server error", type_="server_error").body()
                )
                await response.write(b"data: [DONE]\n\n")
                await response.write_eof()
                return response
            await self._finish_stream(
                response, {**completion, "id": stream_id, "created": created}, options
            )
        except (ConnectionResetError, ConnectionError):
            # The client went away; the turn still runs to completion and is stored.
            logger.info("client of session %s disconnected during a stream", session_id)
        return response

    # ----------------------------------------------------------------- models, health

    def _model_object(self) -> dict[str, Any]:
        return {
            "id": self._model_name,
            "object": "model",
            "created": int(self._started_at),
            "owned_by": "reveille",
        }

    async def _list_models(self, request: web.Request) -> web.Response:
        self._authenticate(request)
        return web.json_response({"object": "list", "data": [self._model_object()]})

    async def _get_model(self, request: web.Request) -> web.Response:
        self._authenticate(request)
        model_id = request.match_info["model_id"]
        if model_id != self._model_name:
            raise ApiError(
                404, f"model {model_id!r} does not exist", code="model_not_found", param="model"
            )
        return web.json_response(self._model_object())

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "status": "ok",
                "platform": self.platform.value,
                "model": self._model_name,
                "active_runs": self._active_runs,
                "max_concurrent_runs": self.max_concurrent_runs,
            }
        )

    # ----------------------------------------------------------------- sessions API

    async def _path_session(self, request: web.Request) -> str:
        self._authenticate(request)
        session_id = request.match_info["session_id"]
        if not is_valid_session_id(session_id):
            raise ApiError(
                400,
                "malformed session id: use 1-128 characters of A-Z a-z 0-9 . _ : -",
                code="invalid_session_id",
            )
        request[SESSION_REQUEST_KEY] = session_id
        return session_id

    @staticmethod
    def _int_query(request: web.Request, name: str, default: int | None) -> int | None:
        raw = request.query.get(name)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            value = -1
        if value < 0:
            raise ApiError(
                400,
                f"query parameter {name!r} must be a whole number >= 0",
                param=name,
                code="invalid_parameter",
            )
        return value

    async def _list_sessions(self, request: web.Request) -> web.Response:
        self._authenticate(request)
        limit = self._int_query(request, "limit", 100) or 0
        offset = self._int_query(request, "offset", 0) or 0
        sessions = await asyncio.to_thread(self.store.list_sessions, min(limit, 1000), offset)
        return web.json_response({"object": "list", "data": sessions})

    async def _create_session(self, request: web.Request) -> web.Response:
        self._authenticate(request)
        body = await self._read_json(request)
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
        session_id = body.get("id")
        title = body.get("title")
        if title is not None and not isinstance(title, str):
            raise ApiError(400, "'title' must be a string", param="title", code="invalid_type")
        if session_id is None:
            session_id = "sess_" + secrets.token_hex(16)
        elif not isinstance(session_id, str) or not is_valid_session_id(session_id):
            raise ApiError(
                400,
                "malformed session id: use 1-128 characters of A-Z a-z 0-9 . _ : -",
                param="id",
                code="invalid_session_id",
            )
        existing = await asyncio.to_thread(self.store.get_session, session_id)
        session = existing or await self._create_api_session(session_id, title)
        request[SESSION_REQUEST_KEY] = session_id
        return web.json_response(
            session, status=200 if existing else 201, headers={SESSION_HEADER: session_id}
        )

    async def _get_session(self, request: web.Request) -> web.Response:
        session_id = await self._path_session(request)
        session = await asyncio.to_thread(self.store.get_session, session_id)
        if session is None:
            raise ApiError(404, f"session {session_id!r} does not exist", code="session_not_found")
        return web.json_response(session, headers={SESSION_HEADER: session_id})

    async def _delete_session(self, request: web.Request) -> web.Response:
        session_id = await self._path_session(request)
        if not await asyncio.to_thread(self.store.delete_session, session_id):
            raise ApiError(404, f"session {session_id!r} does not exist", code="session_not_found")
        return web.json_response(
            {"id": session_id, "object": "session", "deleted": True},
            headers={SESSION_HEADER: session_id},
        )

    async def _session_messages(self, request: web.Request) -> web.Response:
        session_id = await self._path_session(request)
        after_id = self._int_query(request, "after_id", 0) or 0
        limit = self._int_query(request, "limit", None)
        try:
            rows = await asyncio.to_thread(
                self.store.messages, session_id, after_id=after_id, limit=limit
            )
        except SessionGone:
            raise ApiError(
                404, f"session {session_id!r} does not exist", code="session_not_found"
            ) from None
        return web.json_response(
            {"object": "list", "session_id": session_id, "data": rows},
            headers={SESSION_HEADER: session_id},
        )


def _note_unawaited_failure(task: asyncio.Task[Any]) -> None:
    if task.cancelled():
        return
    exc = task.exception()  # marks it retrieved
    if exc is not None and not isinstance(exc, ApiError):
        logger.debug("turn task failed: %r", exc)
