"""The front ends of one ``reveille serve`` process, built from the settings for the
composition root (``reveille.app``): the API server over its turn service, the web UI with
its event log, approvals and delivery target, the chat platforms (``CHAT_PLATFORMS``), and
the agent each surface's turn service gets of its own.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypedDict

from agent import Agent
from agent.providers.base import ModelProvider
from agent.tools import ConfirmCallback, UnitConfirmCallback
from api.event_log import EventLog
from api.server import WebUIServer
from api.wakeups import WebUIDeliveryTarget
from api.web_turns import WebTurns
from delivery.telegram_backend import TelegramBackend
from delivery.webui_state import WebUIStateBackend
from gateway.approvals import ApprovalListener, ApprovalRecord, Approvals
from gateway.config import Platform
from gateway.delivery_targets import PushTarget
from gateway.http.connection_guard import ConnectionLimits
from gateway.http.middleware import is_loopback
from gateway.openai.wire import completion_object
from gateway.run import GatewayRunner, Surface
from gateway.session import SessionStore
from gateway.surfaces.api_server.adapter import ApiServerAdapter
from gateway.turns.compaction import Compactor, provider_summariser
from gateway.turns.service import TurnService, agent_turn_runner
from gateway.webhooks import APPROVAL_REQUESTED, WebhookSender
from reveille import version
from reveille.chat_platform import ChatPlatform
from reveille.discord_app import DISCORD
from reveille.matrix_app import MATRIX
from reveille.metrics import Metrics
from reveille.settings import Settings, SettingsError
from reveille.slack_app import SLACK
from reveille.telegram_app import TELEGRAM
from tools.delegate_tool import DelegationLimits
from tools.process_registry import process_registry
from tools.toolset import build_default_registry
from tools.wake_when_tool import installed_inbox

__all__ = [
    "CHAT_PLATFORMS",
    "approval_webhook",
    "build_adapter",
    "build_agent",
    "build_surfaces",
    "build_webui",
    "check_webui_bind",
    "runtime_watch",
]

# The chat platforms this process can serve, each its package under gateway/surfaces/ and
# its wiring module (reveille.chat_platform): adding one is one line here.
CHAT_PLATFORMS: tuple[ChatPlatform, ...] = (TELEGRAM, DISCORD, MATRIX, SLACK)


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
    agent = build_agent(settings, model)
    turns = TurnService(
        store,
        agent_turn_runner(agent),
        render=functools.partial(completion_object, model=model.name),
        platform=Platform.API_SERVER,
        max_concurrent_runs=settings.max_concurrent_runs,
        context_chars=settings.context_chars,
        compactor=Compactor(store, provider_summariser(model), settings.compaction_policy),
        client_tool_timeout=settings.client_tool_timeout,
        **gateway_approvals(settings, approvals, park=True),
    )
    turns.tool_names = agent.registry.names
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
            if settings.asks_approvals
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
        confirm_for=approvals.confirm_for if settings.asks_approvals else None,
        confirm_unit_for=approvals.confirm_unit_for if settings.asks_approvals else None,
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


class ApprovalArguments(TypedDict, total=False):
    """The approval arguments of a ``TurnService`` (see ``gateway_approvals``)."""

    confirm_for: Callable[..., ConfirmCallback]
    confirm_unit_for: Callable[..., UnitConfirmCallback]
    hold_sessions: bool
    park_on_approval: bool


def gateway_approvals(settings: Settings, approvals: Approvals, *, park: bool) -> ApprovalArguments:
    """The ``TurnService`` arguments that make a gateway surface's turns ask approvals
    (when the shell tool is on with ``[shell] approvals = "always"``), holding the session
    while one is pending; ``park`` answers the turn's client at once (the API server)."""
    if not settings.asks_approvals:
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
        inbox=installed_inbox if settings.hooks else None,
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
