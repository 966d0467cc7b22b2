"""What a chat platform's wiring module hands the composition root: one ``ChatPlatform``.

A platform is a package under ``gateway/surfaces/<name>/`` (its adapter implements the
surface port, ``gateway.surfaces.port.ChatSurface``) plus a wiring module here that builds
it from the settings (``reveille/telegram_app.py``). The root (``reveille.surfaces``) lists the
platforms in ``CHAT_PLATFORMS``; for each one that is ``configured`` it calls ``build`` and
registers a ``PushTarget`` for every adapter built, so wake-ups reach it. Adding a platform
is that package, that wiring module, and one line in ``CHAT_PLATFORMS``.
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

__all__ = ["ChatPlatform", "ChatPlatformBuilder", "chat_turn_service"]


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
