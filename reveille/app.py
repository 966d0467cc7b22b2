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
dialect. The surfaces themselves (API server, web UI, chat platforms) and their agents are
built by ``reveille.surfaces``; this module opens, wires and closes.
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
from typing import Any

import storage
import tools.async_delegation as ad
from agent import build_provider
from agent.providers.base import ModelProvider
from api.server import WebUIServer
from delivery.inbound import Inbox
from delivery.peers import ServerRecord
from delivery.retention import RetentionScheduler, RetentionStores
from delivery.schedules_engine import ScheduleEngine
from gateway.approvals import Approvals
from gateway.config import Platform
from gateway.delivery_targets import ApiServerTarget
from gateway.http.connection_guard import ConnectionLimits, raise_descriptor_limit
from gateway.responses import ResponsesService, TerminalHook
from gateway.run import GatewayRunner, Surface
from gateway.schedule_conversations import conversation_opener
from gateway.session import SessionStore
from gateway.surfaces.api_server.adapter import ApiServerAdapter
from gateway.surfaces.api_server.hooks import HookRoutes
from gateway.webhooks import WebhookSender
from reveille import tracing
from reveille.log_limits import rate_limited_logs
from reveille.metrics import Metrics
from reveille.settings import Settings, SettingsError
from reveille.surfaces import (
    CHAT_PLATFORMS,
    approval_webhook,
    build_adapter,
    build_agent,
    build_surfaces,
    build_webui,
    check_webui_bind,
    runtime_watch,
)
from storage import Storage
from storage.opener import LEGACY_TELEGRAM_FILE, StorageUrlError
from tools import schedule_tool
from tools.background_processes import PROCESSES_DIR
from tools.completion_queue import CompletionQueue
from tools.delegation_runtime import DelegationRuntime
from tools.mcp.manager import mcp_clients
from tools.mcp.oauth import server_oauth, uses_oauth
from tools.mcp.tasks import mcp_tasks
from tools.process_registry import process_registry
from tools.wake_when_tool import install_inbox
from tools.watches import watch_manager

__all__ = [
    "App",
    "build_agent",
    "build_webui",
    "check_webui_bind",
    "open_storage",
    "runtime_watch",
    "serve",
]

logger = logging.getLogger("reveille.app")


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
        schedules = ScheduleEngine(
            runtime.ledger,
            await asyncio.to_thread(location.open_schedules),
            open_conversation=conversation_opener(store),
        )
        schedule_tool.install(schedules)
        stack.callback(schedule_tool.install, None)
        stack.push_async_callback(asyncio.to_thread, schedules.store.close)

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

        # Before the agents are built (each registry takes the servers' tools), on this loop.
        # OAuth servers' tokens and registrations are small values in the store.
        mcp_values = None
        if uses_oauth(settings.mcp_servers):
            mcp_values = await asyncio.to_thread(location.open_telegram)
            stack.push_async_callback(asyncio.to_thread, mcp_values.close)
        mcp = await mcp_clients.start(
            settings.mcp_servers, model=model, auth=server_oauth(mcp_values)
        )
        stack.push_async_callback(mcp_clients.stop, mcp)
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
            hook_foreground=settings.webhook_foreground,
        )
        adapter.mount_responses(responses)
        inbox = await asyncio.to_thread(open_inbox, settings, location)
        if inbox is not None:
            stack.push_async_callback(asyncio.to_thread, inbox.store.close)
            stack.callback(install_inbox, None)
            install_inbox(inbox)  # the wake_when tools built already find it at call time
            adapter.mount_hooks(
                HookRoutes(
                    inbox,
                    max_body_bytes=settings.hooks_max_body_bytes,
                    body_timeout=limits.body_timeout,
                )
            )
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

        # The servers listen first: restored wake-ups self-POST to them. Occurrences of
        # schedules that came due while no server ran are decided first (misfire policy).
        await asyncio.to_thread(schedules.advance_due)
        restored = await asyncio.to_thread(ad.restore_undelivered_completions, queue)
        if restored:
            logger.info("re-offering %d undelivered completion(s)", restored)
        scheduler = await asyncio.to_thread(
            functools.partial(
                runtime.start_scheduler,
                f"api {adapter.host}:{adapter.port}",
                before_pass=schedules.advance_due,
            )
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
                hooks=inbox.store if inbox is not None else None,
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
            _drain_background, runtime, adapter, responses, runner, settings.drain_seconds
        )
        yield App(settings, store, runtime, model, adapter, runner, surfaces, restored, webhooks)


async def _drain_background(
    runtime: DelegationRuntime,
    adapter: ApiServerAdapter,
    responses: ResponsesService,
    runner: GatewayRunner,
    seconds: float,
) -> None:
    adapter.draining = True
    responses.pause()
    began = time.monotonic()
    finished, interrupted = await asyncio.to_thread(runtime.drain, seconds)
    # What finished in time is delivered before the runner stops, within the same grace;
    # what is left stays pending in the ledger and is offered again after the restart.
    settled = await runner.settle_queued(seconds - (time.monotonic() - began))
    logger.info(
        "drained background work in %.1f s: %d finished in time, %d interrupted%s%s",
        time.monotonic() - began,
        finished,
        len(interrupted),
        f" ({', '.join(interrupted)})" if interrupted else "",
        "" if settled else "; deliveries still pending are offered again after the restart",
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


def open_inbox(settings: Settings, location: Storage) -> Inbox | None:
    """The inbound events' store and the declared hooks (``[hooks.NAME]``); None without
    hooks (no route is served and no agent gets ``wake_when``)."""
    if not settings.hooks:
        return None
    return Inbox.of(location.open_hooks(), settings.hooks, settings.hooks_lookback_seconds)


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
    # Likewise its MCP tasks: followed on with the MCP server that keeps them.
    mcp_tasks.attach(runtime, mcp_clients.connection)
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


def log_peers(peers: list[ServerRecord]) -> None:
    if not peers:
        logger.info("no other server shares this state")
        return
    logger.info(
        "%d other server(s) share this state; each takes over the other's work if it dies: %s",
        len(peers),
        "; ".join(peer.describe() for peer in peers),
    )
