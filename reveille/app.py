"""The composition root: the one place that turns settings into a running Reveille.

It builds, in this order, settings -> storage (the ledger file and the session store under
``REVEILLE_HOME``) -> the delegation runtime of the contract module ``tools.async_delegation``
-> the model provider and the agent with its toolset -> the API server -> the web UI (its own
turn service for ``Platform.WEBUI``, event log, approvals and delivery target, registered on
the runner and started with it) -> the gateway runner, and hands each piece down. Nothing
below ``reveille/`` reads settings: the floors under this one receive what they need from
here.

``open_storage(url)`` is the only code that names a concrete storage backend.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import tools.async_delegation as ad
from agent import Agent, build_provider
from agent.providers.base import ModelProvider
from api.approvals import Approval, Approvals
from api.event_log import EventLog
from api.server import WebUIServer
from api.wakeups import WebUIDeliveryTarget
from api.web_turns import WebTurns
from delivery.sqlite_files import ensure_private_dir
from gateway.config import Platform
from gateway.platforms.api_server import ApiServerAdapter
from gateway.platforms.http_middleware import is_loopback
from gateway.platforms.openai_wire import completion_object
from gateway.run import GatewayRunner, RunnerParts, Surface
from gateway.session import SessionStore
from gateway.turns import TurnService, agent_turn_runner
from reveille.settings import Settings, SettingsError
from tools.completion_queue import CompletionQueue
from tools.process_registry import process_registry
from tools.toolset import build_default_registry

__all__ = ["StorageLocation", "build_runner", "build_webui", "check_webui_bind", "open_storage"]


@dataclass(frozen=True)
class StorageLocation:
    """Where the ledger and the session store live, parsed from a storage url."""

    ledger_path: Path
    sessions_path: Path


def open_storage(url: str) -> StorageLocation:
    """Resolve a storage url: ``sqlite:///abs/dir`` (the state directory) is the one known today.

    An unknown scheme is refused with a message that names the accepted ones, so that a
    typo in ``[storage] url`` stops the server at start instead of writing somewhere else.
    """
    parts = urlsplit(url)
    if parts.scheme != "sqlite":
        raise SettingsError(f"storage url {url!r}: unknown scheme; expected sqlite:///<directory>")
    if parts.netloc:
        raise SettingsError(f"storage url {url!r}: a sqlite url has no host (sqlite:///path)")
    home = Path(unquote(parts.path)).expanduser()
    try:
        ensure_private_dir(home)
    except OSError as exc:
        raise SettingsError(f"state directory {home}: {exc}") from None
    return StorageLocation(home / "ledger.db", home / "sessions.db")


def storage_url(settings: Settings) -> str:
    return f"sqlite://{settings.home.expanduser().resolve().as_posix()}"


def build_runner(
    settings: Settings,
    *,
    provider: ModelProvider | None = None,
    shutdown_grace_seconds: float = 10.0,
) -> GatewayRunner:
    """A gateway runner wired from ``settings``; ``provider`` overrides the configured one
    (tests, benchmarks) and is then left open when the runner stops."""
    storage = open_storage(storage_url(settings))
    owns_provider = provider is None
    model = provider or build_provider(
        kind=settings.provider,
        base_url=settings.openai_base_url or None,
        api_key=settings.openai_api_key or None,
        model=settings.model,
        demo_delay=settings.demo_delay_seconds,
    )

    def open_runtime(queue: CompletionQueue) -> Any:
        return ad.configure_runtime(
            str(storage.ledger_path),
            policy=settings.delivery_policy,
            completion_queue=queue,
            max_queued=settings.max_queued_delegations,
        )

    def build_adapter(store: SessionStore, model: ModelProvider) -> ApiServerAdapter:
        registry = build_default_registry(
            model,
            shell_enabled=settings.shell_enabled,
            workdir=settings.shell_workdir or None,
            max_async_children=settings.max_async_children,
        )
        turns = TurnService(
            store,
            agent_turn_runner(Agent(model, registry)),
            render=functools.partial(completion_object, model=model.name),
            platform=Platform.API_SERVER,
            max_concurrent_runs=settings.max_concurrent_runs,
        )
        return ApiServerAdapter(
            store=store,
            turns=turns,
            host=settings.host,
            port=settings.port,
            api_key=settings.api_key,
            model_name=model.name,
            allowed_origins=settings.allowed_origins,
            max_body_bytes=settings.max_body_bytes,
        )

    def build_surfaces(
        store: SessionStore, model: ModelProvider, runner: GatewayRunner
    ) -> list[Surface]:
        if settings.webui_port == 0:
            return []
        server = build_webui(settings, store, model, home=storage.ledger_path.parent)
        runner.register_target(Platform.WEBUI, server.target)
        return [server]

    if settings.webui_port:
        check_webui_bind(settings)
    parts = RunnerParts(
        open_store=lambda: SessionStore(storage.sessions_path),
        open_runtime=open_runtime,
        provider=model,
        build_adapter=build_adapter,
        owns_provider=owns_provider,
        build_surfaces=build_surfaces,
    )
    return GatewayRunner(parts, shutdown_grace_seconds=shutdown_grace_seconds)


def check_webui_bind(settings: Settings) -> None:
    """A web UI beyond loopback needs a password: refuse to start without one."""
    if not is_loopback(settings.host) and not settings.webui_password:
        raise SettingsError(
            f"the web UI would listen on {settings.host}, beyond loopback, without a password; "
            "set REVEILLE_WEBUI_PASSWORD ([webui] password), bind 127.0.0.1, or turn the web "
            "UI off with REVEILLE_WEBUI_PORT=0"
        )


def build_webui(
    settings: Settings, store: SessionStore, model: ModelProvider, *, home: Path
) -> WebUIServer:
    """The web UI: its own turn service (``Platform.WEBUI``) over the same store and model,
    its event log, approvals when the shell tool is on, and its delivery target."""
    log = EventLog(home / "webui.db")
    turns_box: list[WebTurns] = []

    async def approval_changed(approval: Approval) -> None:
        await log.append(
            "approval", {"session_id": approval.session_id, "approval": approval.as_dict()}
        )
        if turns_box:
            await turns_box[0].announce_session(approval.session_id)

    approvals = Approvals(approval_changed)
    registry = build_default_registry(
        model,
        shell_enabled=settings.shell_enabled,
        workdir=settings.shell_workdir or None,
        max_async_children=settings.max_async_children,
    )
    service = TurnService(
        store,
        agent_turn_runner(Agent(model, registry)),
        render=lambda result: {"content": str(result.content or "")},
        platform=Platform.WEBUI,
        max_concurrent_runs=settings.max_concurrent_runs,
        confirm_for=approvals.confirm_for if settings.shell_enabled else None,
    )
    turns = WebTurns(
        store, service, log, approvals, runtime_stale=runtime_watch(settings_files(settings))
    )
    turns_box.append(turns)
    target = WebUIDeliveryTarget(turns, log, process_registry=process_registry)
    return WebUIServer(
        store=store,
        turns=turns,
        log=log,
        approvals=approvals,
        target=target,
        host=settings.host,
        port=settings.webui_port,
        password=settings.webui_password,
        model_name=model.name,
        shell_enabled=settings.shell_enabled,
        version=_version(),
        max_body_bytes=settings.max_body_bytes,
    )


def settings_files(settings: Settings) -> list[Path]:
    """The files whose change makes a running agent stale: its code and its settings file."""
    import os

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


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("reveille")
    except Exception:
        return "0.1.0"
