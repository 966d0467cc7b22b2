"""What a chat platform's wiring module hands the composition root: one ``ChatPlatform``.

A platform is a package under ``gateway/surfaces/<name>/`` (its adapter implements the
surface port, ``gateway.surfaces.port.ChatSurface``) plus a wiring module here that builds
it from the settings (``reveille/telegram_app.py``), most simply with ``chat_platform``: the
platform's name, its ``Platform``, when it is on, and how to make its adapter from a
``PlatformWiring`` (its settings, its own ``TurnService``, the store's chat-platform state,
approvals, the API server); the turn service and the metrics are wired here, once. The
root (``reveille.surfaces``) lists the platforms in ``CHAT_PLATFORMS``; for each one that is
``configured`` it calls ``build`` and registers a ``PushTarget`` for every adapter built, so
wake-ups reach it. Adding a platform is that package, that wiring module, and one line in
``CHAT_PLATFORMS``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from agent import Agent
from delivery.telegram_backend import TelegramBackend
from gateway.approvals import Approvals
from gateway.config import Platform
from gateway.session import SessionStore
from gateway.surfaces.api_server.adapter import ApiServerAdapter
from gateway.surfaces.port import ChatSurface
from gateway.turns.compaction import Compactor, provider_summariser
from gateway.turns.service import TurnService, agent_turn_runner
from reveille.settings import Settings

__all__ = [
    "AdapterMaker",
    "ChatPlatform",
    "ChatPlatformBuilder",
    "PlatformWiring",
    "chat_platform",
    "chat_turn_service",
]


class ChatPlatformBuilder(Protocol):
    """Builds a platform's adapters over the shared store and agent. ``api_server`` is there
    for platforms that take webhooks on its port; ``state`` is the store's chat-platform
    state (inbox, offsets, reply records, chat map; ``delivery.telegram_backend``);
    ``approvals``, when given, is asked with the platform's buttons; ``metrics`` watches its
    turns."""

    def __call__(
        self,
        settings: Settings,
        store: SessionStore,
        agent: Agent,
        api_server: ApiServerAdapter,
        metrics: Any = None,
        *,
        state: TelegramBackend | None = None,
        approvals: Approvals | None = None,
    ) -> list[ChatSurface]: ...


@dataclass(frozen=True)
class ChatPlatform:
    """A chat platform the root can serve: whether the settings turn it on, how to build it."""

    name: str
    configured: Callable[[Settings], bool]
    build: ChatPlatformBuilder


def _render(result: Any) -> dict[str, Any]:
    return {"content": str(result.content or "")}


def chat_turn_service(
    settings: Settings,
    store: SessionStore,
    agent: Agent,
    platform: Platform,
    approvals: Approvals | None,
) -> TurnService:
    """The turn service of a chat platform: a chat's session id is its routing key; with
    ``approvals`` its turns ask them (the platform's buttons), holding the session while
    one is pending. The same for every platform, so it is written once here."""
    return TurnService(
        store,
        agent_turn_runner(agent),
        render=_render,
        platform=platform,
        max_concurrent_runs=settings.max_concurrent_runs,
        context_chars=settings.context_chars,
        compactor=Compactor(store, provider_summariser(agent.provider), settings.compaction_policy),
        session_key_of=lambda session_id: session_id,
        confirm_for=approvals.confirm_for if approvals is not None else None,
        confirm_unit_for=approvals.confirm_unit_for if approvals is not None else None,
        hold_sessions=approvals is not None,
    )


@dataclass(frozen=True)
class PlatformWiring:
    """What a platform's adapter is made of: the settings, the platform's own turn service,
    the store's chat-platform state (None where the root opened none), approvals (None when
    the shell asks none) and the API server (for webhook routes on its port)."""

    settings: Settings
    turns: TurnService
    state: TelegramBackend | None
    approvals: Approvals | None
    api_server: ApiServerAdapter | None


AdapterMaker = Callable[[PlatformWiring], ChatSurface]


def chat_platform(
    name: str,
    platform: Platform,
    *,
    configured: Callable[[Settings], bool],
    make: AdapterMaker,
    needs_state: bool = False,
) -> ChatPlatform:
    """A ``ChatPlatform`` whose builder, when ``configured``, makes the one adapter of
    ``platform`` with ``make`` over its own turn service (``chat_turn_service``), watched by
    the metrics. ``needs_state``: the adapter cannot run without the store's chat-platform
    state (what it must keep outlives the process), so its absence is an error."""

    def build(
        settings: Settings,
        store: SessionStore,
        agent: Agent,
        api_server: ApiServerAdapter | None = None,
        metrics: Any = None,
        *,
        state: TelegramBackend | None = None,
        approvals: Approvals | None = None,
    ) -> list[ChatSurface]:
        if not configured(settings):
            return []
        if needs_state and state is None:
            raise RuntimeError(f"{name} needs the store's chat-platform state")
        turns = chat_turn_service(settings, store, agent, platform, approvals)
        adapter = make(PlatformWiring(settings, turns, state, approvals, api_server))
        if metrics is not None:
            metrics.watch_turns(platform.value, turns)
        return [adapter]

    return ChatPlatform(name=name, configured=configured, build=build)
