"""The composition root: the one place that turns settings into a running Reveille.

``serve(settings)`` opens, in this order, storage (the ledger file and the session store
under ``REVEILLE_HOME``, or both in PostgreSQL when ``REVEILLE_DATABASE_URL`` is set) -> the
delegation runtime of the contract module ``tools.async_delegation`` -> the model provider
and the agent with its toolset -> the API server -> the web UI (its own turn service for
``Platform.WEBUI``, event log, approvals and delivery target) and Telegram -> the re-offer
scheduler -> the gateway runner's watcher -> the webhook sender (with ``[webhooks] urls``),
on one ``AsyncExitStack`` that closes them in reverse. Before any of that it lifts the
open-file limit to the hard limit and sizes both ports' connection caps from it
(``gateway.http.connection_guard``), and puts the rate limit on the loggers a client
can make talk (``reveille.log_limits``). Nothing below
``reveille/`` reads settings: the floors under this one receive what they need from here.

Storage is opened through ``storage.open_storage(url)``, the only code that names a storage
dialect.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import storage
import tools.async_delegation as ad
from agent import Agent, build_provider
from agent.providers.base import ModelProvider
from api.event_log import EventLog
from api.server import WebUIServer
from api.wakeups import WebUIDeliveryTarget
from api.web_turns import WebTurns
from delivery.peers import ServerRecord
from delivery.retention import RetentionScheduler, RetentionStores
from delivery.telegram_backend import TelegramBackend
from delivery.webui_state import WebUIStateBackend
from gateway.approvals import ApprovalListener, ApprovalRecord, Approvals
from gateway.config import Platform
from gateway.delivery_targets import ApiServerTarget, PushTarget
from gateway.http.connection_guard import ConnectionLimits, raise_descriptor_limit
from gateway.http.middleware import is_loopback
from gateway.openai.wire import completion_object
from gateway.responses import ResponsesService, TerminalHook
from gateway.run import GatewayRunner, Surface
from gateway.session import SessionStore
from gateway.surfaces.api_server.adapter import ApiServerAdapter
from gateway.turns.compaction import Compactor, provider_summariser
from gateway.turns.service import TurnService, agent_turn_runner
from gateway.webhooks import APPROVAL_REQUESTED, WebhookSender
from reveille import tracing, version
from reveille.chat_platform import ChatPlatform
from reveille.discord_app import DISCORD
from reveille.log_limits import rate_limited_logs
from reveille.matrix_app import MATRIX
from reveille.metrics import Metrics
from reveille.settings import Settings, SettingsError
from reveille.telegram_app import TELEGRAM
from storage import Storage
from storage.opener import LEGACY_TELEGRAM_FILE, StorageUrlError
from tools.background_processes import PROCESSES_DIR
from tools.completion_queue import CompletionQueue
from tools.delegate_tool import DelegationLimits
from tools.delegation_runtime import DelegationRuntime
from tools.process_registry import process_registry
from tools.toolset import build_default_registry
from tools.watches import watch_manager

__all__ = ["App", "build_webui", "check_webui_bind", "open_storage", "serve"]

logger = logging.getLogger("reveille.app")

# The chat platforms this process can serve, each its package under gateway/surfaces/ and
# its wiring module (reveille.chat_platform): adding one is one line here.
CHAT_PLATFORMS: tuple[ChatPlatform, ...] = (TELEGRAM, DISCORD, MATRIX)


def open_storage(url: str, origin: str | None = None) -> Storage:
    """The storage a url names, prepared (``storage.open_storage``); a url it cannot open
    stops the start as a settings error naming it (and ``origin``: where it was set)."""
    try:
        return storage.open_storage(url)
    except StorageUrlError as exc:
        raise SettingsError(f"{origin}: {exc}" if origin else str(exc)) from None


def storage_origin(settings: Settings) -> str:
    """Where the storage url came from: the database url's setting, or the state directory's."""
    if settings.database_url:
        return settings.origin("database_url")
    return settings.origin("home")


def storage_url(settings: Settings) -> str:
    if settings.database_url:
        return settings.database_url
    return f"sqlite://{settings.home.expanduser().resolve().as_posix()}"


@dataclass
class App:
    """A running Reveille, as ``serve`` yields it: the pieces it opened, for the CLI's banner,
    tests and benchmarks."""

    settings: Settings
    store: SessionStore
    runtime: DelegationRuntime
    provider: ModelProvider
    adapter: ApiServerAdapter
    runner: GatewayRunner
    surfaces: list[Surface] = field(default_factory=list)
    restored: int = 0
    # None without [webhooks] urls; the Responses API's terminal states call its on_terminal
    webhooks: WebhookSender | None = None

    @property
    def webui(self) -> WebUIServer | None:
        return next((s for s in self.surfaces if isinstance(s, WebUIServer)), None)


@contextlib.asynccontextmanager
async def serve(
    settings: Settings,
    *,
    provider: ModelProvider | None = None,
    shutdown_grace_seconds: float = 10.0,
    reuse_port: bool = False,
    server_secret: str | None = None,
    connection_limits: ConnectionLimits | None = None,
    on_terminal: TerminalHook | None = None,
) -> AsyncIterator[App]:
    """Open everything ``settings`` describe, in order, and close it in reverse on exit.

    Storage (the session store; the ledger under the delegation runtime of the contract
    module), the model provider, the API server, the other surfaces (web UI, Telegram), the
    re-offer of what a previous run left undelivered, the ledger's re-offer scheduler, and
    the gateway runner's completion watcher last, once every delivery target is listening.
    ``provider`` overrides the configured one (tests, benchmarks) and is then left open.
    ``reuse_port`` binds both ports with SO_REUSEPORT: this process is one of the workers
    of ``reveille serve --workers N`` (``reveille.workers``), all listening on them, and
    ``server_secret`` is what they share to take each other's wake-up self-POSTs as their own.
    ``connection_limits`` overrides the caps and deadlines of both ports, which are
    otherwise sized from the open-file limit (raised to the hard limit first).
    ``on_terminal(response_id, event_type)`` is told each time a stored response of the
    Responses API ends (``response.completed`` ...; at least once): the webhook sender.
    """
    if settings.webui_port:
        check_webui_bind(settings)
    grace = shutdown_grace_seconds
    descriptors = raise_descriptor_limit()
    limits = connection_limits or ConnectionLimits.for_descriptors(descriptors)
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(rate_limited_logs())
        # First in, last out: the spans of the shutdown itself are exported too.
        if (flush_traces := tracing.configure(settings)) is not None:
            stack.push_async_callback(asyncio.to_thread, flush_traces)
        location = await asyncio.to_thread(
            open_storage, storage_url(settings), storage_origin(settings)
        )
        store = SessionStore(await asyncio.to_thread(location.open_sessions))
        stack.push_async_callback(asyncio.to_thread, store.close)

        queue = process_registry.completion_queue
        runtime = await asyncio.to_thread(_open_runtime, settings, location, queue)
        stack.push_async_callback(asyncio.to_thread, ad.reset_runtime)
        stack.callback(process_registry.detach)
        stack.callback(watch_manager.detach)

        model = provider or build_provider(
            kind=settings.provider,
            base_url=settings.openai_base_url or None,
            api_key=settings.openai_api_key or None,
            model=settings.model,
            demo_delay=settings.demo_delay_seconds,
        )
        aclose = getattr(model, "aclose", None)
        if provider is None and aclose is not None:
            stack.push_async_callback(_quietly, aclose)

        metrics = Metrics()
        backend = runtime.ledger.backend
        metrics.ledger_counts = backend.delivery_counts
        metrics.watch_store(ledger_pending=backend.pending_counts)
        metrics.watch_writer("ledger", backend.stats)
        runner = GatewayRunner(
            store,
            queue=queue,
            on_outcome=metrics.observe,
            shutdown_grace_seconds=grace,
            coalesce_seconds=settings.coalesce_seconds,
        )
        # One for the API server and Telegram: a decision through either wakes the turn
        # at once (the web UI's has its own, announced through its event log).
        approvals = Approvals(store, timeout_seconds=settings.shell_approval_timeout)
        adapter = build_adapter(
            settings,
            store,
            model,
            metrics,
            approvals=approvals,
            reuse_port=reuse_port,
            server_secret=server_secret,
            connection_limits=limits,
        )
        webhooks = await asyncio.to_thread(open_webhooks, settings, location)
        requested = None
        if webhooks is not None:
            stack.push_async_callback(asyncio.to_thread, webhooks.backend.close)
            requested = approval_webhook(webhooks)
            approvals.on_requested = requested
            metrics.webhook_stats = webhooks.backend.endpoint_stats
        runner.register_target(Platform.API_SERVER, ApiServerTarget(store, adapter, webhooks))
        if on_terminal is None and webhooks is not None:
            on_terminal = webhooks.on_terminal  # called on a worker thread: the blocking one
        responses = ResponsesService(
            await asyncio.to_thread(location.open_responses),
            adapter.turns,
            on_terminal=on_terminal,
            lease_seconds=settings.responses_lease_seconds,
            background_concurrency=settings.responses_background_concurrency,
            max_queued=settings.responses_max_queued,
            max_queued_per_key=settings.responses_max_queued_per_key,
        )
        adapter.mount_responses(responses)
        metrics.watch_store(responses=responses.store.status_counts)
        # Closes its store even if the server never starts (a second stop does nothing).
        stack.push_async_callback(responses.stop, grace)
        # Built before the API server starts (Telegram's webhook adds a route to it),
        # started once it listens.
        webui_state = await asyncio.to_thread(location.open_webui) if settings.webui_port else None
        chat_state = None
        if any(platform.configured(settings) for platform in CHAT_PLATFORMS):
            # The chat platforms' state (inbox, offsets, replies, chat map) is the store's;
            # an old telegram.db in the state directory is moved into it first.
            legacy = settings.home / LEGACY_TELEGRAM_FILE
            chat_state = await asyncio.to_thread(location.open_telegram, legacy_file=legacy)
            stack.push_async_callback(asyncio.to_thread, chat_state.close)
        surfaces = build_surfaces(
            settings,
            store,
            model,
            adapter,
            runner,
            metrics,
            webui_state,
            approvals=approvals,
            reuse_port=reuse_port,
            connection_limits=limits,
            on_approval_requested=requested,
            chat_state=chat_state,
        )
        await adapter.start()
        # Said once the server listens: a start that fails says only why it failed.
        logger.info(
            "open-file limit %d: at most %d connections per port, %d per client address",
            descriptors,
            limits.max_connections,
            limits.max_per_address,
        )
        stack.push_async_callback(adapter.stop, grace_seconds=grace)
        # Started once the server listens; stopped before it (callbacks run in reverse):
        # its running responses get the grace period, then end failed with a reason.
        await responses.start()
        stack.push_async_callback(responses.stop, grace)
        for surface in surfaces:
            await surface.start()
            stack.push_async_callback(_stop_surface, surface, grace)

        # The servers listen first: restored wake-ups self-POST to them.
        restored = await asyncio.to_thread(ad.restore_undelivered_completions, queue)
        if restored:
            logger.info("re-offering %d undelivered completion(s)", restored)
        scheduler = await asyncio.to_thread(
            runtime.start_scheduler, f"api {adapter.host}:{adapter.port}"
        )
        log_peers(scheduler.peers_at_start)
        retention = RetentionScheduler(
            RetentionStores(
                ledger=runtime.ledger.backend,
                sessions=store.backend,
                webui=webui_state,
                processes_dir=settings.home / PROCESSES_DIR,
                responses=responses.store,
                reclaim=location.reclaim_space,
            ),
            settings.retention_policy,
            holder=runtime.ledger.identity,
            # Not at the very start: a restart is no moment for the first prune as well.
            first_delay_seconds=min(60.0, settings.retention_interval_seconds),
        )
        retention.start()
        stack.push_async_callback(retention.aclose)
        await runner.start()
        stack.push_async_callback(runner.stop)
        if webhooks is not None:
            # Pending webhooks of an earlier run (or of a dead server) are sent from here on.
            await webhooks.start()
            stack.push_async_callback(webhooks.stop)
        # First thing at exit, while the runner and the surfaces still deliver: running
        # background work gets its grace period (and /readyz says draining meanwhile).
        stack.push_async_callback(
            _drain_background, runtime, adapter, responses, settings.drain_seconds
        )
        yield App(settings, store, runtime, model, adapter, runner, surfaces, restored, webhooks)


async def _drain_background(
    runtime: DelegationRuntime,
    adapter: ApiServerAdapter,
    responses: ResponsesService,
    seconds: float,
) -> None:
    adapter.draining = True
    responses.pause()
    began = time.monotonic()
    finished, interrupted = await asyncio.to_thread(runtime.drain, seconds)
    logger.info(
        "drained background work in %.1f s: %d finished in time, %d interrupted%s",
        time.monotonic() - began,
        finished,
        len(interrupted),
        f" ({', '.join(interrupted)})" if interrupted else "",
    )


def open_webhooks(settings: Settings, location: Storage) -> WebhookSender | None:
    """The webhook sender over the store's webhook tables, when endpoints are configured.
    Endpoints without any secret (configured or stored) stop the start: nothing could be
    signed."""
    urls = settings.webhook_endpoints
    if not urls:
        return None
    backend = location.open_webhooks()
    try:
        if not settings.webhook_secret and not backend.secrets(time.time()):
            raise SettingsError(
                "webhook_urls is set but there is no webhook secret: set "
                "REVEILLE_WEBHOOK_SECRET ([webhooks] secret) or run `reveille webhooks secret`"
            )
    except BaseException:
        backend.close()
        raise
    return WebhookSender(
        backend,
        urls,
        secret=settings.webhook_secret,
        consumer=f"{socket.gethostname()}:{os.getpid()}",
    )


def _open_runtime(
    settings: Settings, location: Storage, queue: CompletionQueue
) -> DelegationRuntime:
    runtime = ad.configure_runtime(
        backend=location.open_ledger(),
        policy=settings.delivery_policy,
        completion_queue=queue,
        max_queued=settings.max_queued_delegations,
    )
    # Before the first recovery: background commands of a dead server are adopted (their
    # real exit status reported), not settled as unknown.
    process_registry.attach(runtime.ledger, directory=settings.home / PROCESSES_DIR)
    # Likewise its watches: a survivor (or this server, restarted) follows them on.
    watch_manager.attach(
        runtime.ledger, shell_enabled=settings.shell_enabled, workdir=settings.shell_workdir or None
    )
    return runtime


async def _stop_surface(surface: Surface, grace: float) -> None:
    try:
        await surface.stop(grace_seconds=grace)
    except Exception:
        logger.exception("stopping %s failed", type(surface).__name__)


async def _quietly(aclose: Callable[[], Awaitable[Any]]) -> None:
    with contextlib.suppress(Exception):
        await aclose()


def build_adapter(
    settings: Settings,
    store: SessionStore,
    model: ModelProvider,
    metrics: Metrics,
    *,
    approvals: Approvals | None = None,
    reuse_port: bool = False,
    server_secret: str | None = None,
    connection_limits: ConnectionLimits | None = None,
) -> ApiServerAdapter:
    """The API server over its own turn service (``Platform.API_SERVER``); with approvals
    on, its turns ask them and answer their client at once while one is pending."""
    approvals = approvals or Approvals(store, timeout_seconds=settings.shell_approval_timeout)
    turns = TurnService(
        store,
        agent_turn_runner(build_agent(settings, model)),
        render=functools.partial(completion_object, model=model.name),
        platform=Platform.API_SERVER,
        max_concurrent_runs=settings.max_concurrent_runs,
        context_chars=settings.context_chars,
        compactor=Compactor(store, provider_summariser(model), settings.compaction_policy),
        **gateway_approvals(settings, approvals, park=True),
    )
    adapter = ApiServerAdapter(
        store=store,
        turns=turns,
        host=settings.host,
        port=settings.port,
        api_key=settings.api_key,
        model_name=model.name,
        allowed_origins=settings.allowed_origins,
        max_body_bytes=settings.max_body_bytes,
        reuse_port=reuse_port,
        server_secret=server_secret,
        connection_limits=connection_limits,
        approvals=approvals,
    )
    metrics.install(adapter.app)
    metrics.watch_turns(Platform.API_SERVER.value, turns)
    metrics.watch_writer("sessions", getattr(store.backend, "stats", lambda: None))
    metrics.watch_store(approvals=store.backend.approval_counts)
    return adapter


def build_surfaces(
    settings: Settings,
    store: SessionStore,
    model: ModelProvider,
    adapter: ApiServerAdapter,
    runner: GatewayRunner,
    metrics: Metrics,
    webui_state: WebUIStateBackend | None,
    *,
    approvals: Approvals | None = None,
    reuse_port: bool = False,
    connection_limits: ConnectionLimits | None = None,
    on_approval_requested: ApprovalListener | None = None,
    chat_state: TelegramBackend | None = None,
) -> list[Surface]:
    """The other front ends of this process (web UI, Telegram, Discord), each with its delivery
    target registered on the runner."""
    surfaces: list[Surface] = []
    if webui_state is not None:
        server = build_webui(
            settings,
            store,
            model,
            webui_state,
            reuse_port=reuse_port,
            connection_limits=connection_limits,
        )
        server.approvals.on_requested = on_approval_requested
        runner.register_target(Platform.WEBUI, server.target)
        surfaces.append(server)
    platforms = [p for p in CHAT_PLATFORMS if p.configured(settings)]
    if platforms:
        agent = build_agent(settings, model)
        asks = (
            approvals or Approvals(store, timeout_seconds=settings.shell_approval_timeout)
            if settings.shell_asks
            else None
        )
        for platform in platforms:
            for chat in platform.build(
                settings, store, agent, adapter, metrics, state=chat_state, approvals=asks
            ):
                runner.register_target(
                    chat.platform, PushTarget(chat, wake_text_budget=settings.wake_text_budget)
                )
                surfaces.append(chat)
    return surfaces


def log_peers(peers: list[ServerRecord]) -> None:
    if not peers:
        logger.info("no other server shares this state")
        return
    logger.info(
        "%d other server(s) share this state; each takes over the other's work if it dies: %s",
        len(peers),
        "; ".join(peer.describe() for peer in peers),
    )


def check_webui_bind(settings: Settings) -> None:
    """A web UI beyond loopback needs a password: refuse to start without one."""
    if not is_loopback(settings.host) and not settings.webui_password:
        raise SettingsError(
            f"{settings.origin('host')}: the web UI would listen on {settings.host}, beyond "
            "loopback, without a password; "
            "set REVEILLE_WEBUI_PASSWORD ([webui] password), bind 127.0.0.1, or turn the web "
            "UI off with REVEILLE_WEBUI_PORT=0"
        )


def build_webui(
    settings: Settings,
    store: SessionStore,
    model: ModelProvider,
    webui_state: WebUIStateBackend,
    *,
    reuse_port: bool = False,
    connection_limits: ConnectionLimits | None = None,
) -> WebUIServer:
    """The web UI: its own turn service (``Platform.WEBUI``) over the same store and model,
    its event log (over ``webui_state``, which it then owns), approvals when the shell tool
    is on, and its delivery target."""
    log = EventLog(webui_state, **stream_caps(connection_limits))
    # The web UI's turns listen to it (they announce its changes).
    approvals = Approvals(store, timeout_seconds=settings.shell_approval_timeout)
    service = TurnService(
        store,
        agent_turn_runner(build_agent(settings, model)),
        render=lambda result: {"content": str(result.content or "")},
        platform=Platform.WEBUI,
        max_concurrent_runs=settings.max_concurrent_runs,
        context_chars=settings.context_chars,
        compactor=Compactor(store, provider_summariser(model), settings.compaction_policy),
        confirm_for=approvals.confirm_for if settings.shell_asks else None,
        confirm_unit_for=approvals.confirm_unit_for if settings.shell_asks else None,
    )
    turns = WebTurns(
        store, service, log, approvals, runtime_stale=runtime_watch(settings_files(settings))
    )
    target = WebUIDeliveryTarget(
        turns,
        log,
        process_registry=process_registry,
        coalesce_seconds=settings.coalesce_seconds,
        wake_text_budget=settings.wake_text_budget,
    )
    return WebUIServer(
        store=store,
        turns=turns,
        log=log,
        approvals=approvals,
        target=target,
        host=settings.host,
        port=settings.webui_port,
        password=settings.webui_password,
        api_key_set=bool(settings.api_key),
        trusted_proxies=settings.webui_trusted_proxy_set,
        model_name=model.name,
        shell_enabled=settings.shell_enabled,
        version=version(),
        max_body_bytes=settings.max_body_bytes,
        reuse_port=reuse_port,
        connection_limits=connection_limits,
    )


def approval_webhook(webhooks: WebhookSender) -> ApprovalListener:
    """What owes the ``reveille.approval.requested`` webhook of a background unit's approval."""

    async def requested(approval: ApprovalRecord) -> None:
        await webhooks.aenqueue(APPROVAL_REQUESTED, approval.id)

    return requested


def gateway_approvals(settings: Settings, approvals: Approvals, *, park: bool) -> dict[str, Any]:
    """The ``TurnService`` arguments that make a gateway surface's turns ask approvals
    (when the shell tool is on with ``[shell] approvals = "always"``), holding the session
    while one is pending; ``park`` answers the turn's client at once (the API server)."""
    if not settings.shell_asks:
        return {}
    return {
        "confirm_for": approvals.confirm_for,
        "confirm_unit_for": approvals.confirm_unit_for,
        "hold_sessions": True,
        "park_on_approval": park,
    }


def stream_caps(limits: ConnectionLimits | None) -> dict[str, int]:
    """The web UI's caps on open event streams, kept under its port's connection caps:
    streams are busy connections that never yield their place, so at most half the port's
    connections (256 at most) and half an address's (32 at most) may be streams; the rest
    stay free for requests."""
    if limits is None:
        return {}
    return {
        "max_streams": max(1, min(256, limits.max_connections // 2)),
        "max_streams_per_owner": max(1, min(32, limits.max_per_address // 2)),
    }


def build_agent(settings: Settings, model: ModelProvider) -> Agent:
    """An agent over ``model`` with the default toolset as the settings shape it (the shell
    tool only when enabled); every surface's turn service gets one of its own."""
    registry = build_default_registry(
        model,
        shell_enabled=settings.shell_enabled,
        workdir=settings.shell_workdir or None,
        max_async_children=settings.max_async_children,
        delegation=DelegationLimits(
            max_depth=settings.delegation_max_depth,
            max_steps=settings.delegation_max_steps,
            stall_seconds=settings.delegation_stall_seconds,
        ),
        shell_requires_approval=settings.shell_asks,
        wakeup_min_delay_seconds=settings.timers_min_delay_seconds,
    )
    return Agent(model, registry)


def settings_files(settings: Settings) -> list[Path]:
    """The files whose change makes a running agent stale: its code and its settings file."""
    import agent

    code = sorted(Path(agent.__file__).resolve().parent.rglob("*.py"))
    config = Path(os.environ.get("REVEILLE_CONFIG") or settings.home / "config.toml")
    return [*code, config.expanduser()]


def runtime_watch(paths: list[Path]) -> Callable[[], bool]:
    """True once any of ``paths`` changed (or appeared, or went) since the server started:
    the agent code or model configuration under it is no longer what it runs (``409
    agent_runtime_stale``, retryable: a restart picks the change up)."""

    def snapshot() -> tuple[int, ...]:
        marks = []
        for path in paths:
            try:
                marks.append(path.stat().st_mtime_ns)
            except OSError:
                marks.append(-1)
        return tuple(marks)

    first = snapshot()
    return lambda: snapshot() != first
