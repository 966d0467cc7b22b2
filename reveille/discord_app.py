"""Wiring of the Discord surface, called from the composition root (``reveille.app``).

The root says *that* Discord is wired; this module says *how*: its own ``TurnService`` of
``Platform.DISCORD`` over the agent the root built for it, the bot token, the allowed users
and the REST root (``DISCORD_API_BASE``). discord.py is imported only when a token is set.
"""

from __future__ import annotations

from typing import Any

from agent import Agent
from delivery.telegram_backend import TelegramBackend
from gateway.approvals import Approvals
from gateway.config import Platform
from gateway.session import SessionStore
from gateway.surfaces.api_server.adapter import ApiServerAdapter
from gateway.surfaces.port import ChatSurface
from gateway.surfaces.telegram.state import TelegramState
from reveille.chat_platform import ChatPlatform, chat_turn_service
from reveille.settings import Settings

__all__ = ["DISCORD", "discord_surfaces"]


def discord_surfaces(
    settings: Settings,
    store: SessionStore,
    agent: Agent,
    api_server: ApiServerAdapter | None = None,
    metrics: Any = None,
    *,
    state: TelegramBackend | None = None,
    approvals: Approvals | None = None,
) -> list[ChatSurface]:
    """The Discord adapter when a bot token is configured, else nothing. With ``approvals``
    its turns ask them (buttons in the chat), holding the session while one is pending.
    ``state`` (the store's chat-platform state) keeps its reply records and ``/new`` map, so
    a restart or another server answers a message once; without it they live in memory.
    ``api_server`` is unused (Discord takes no webhooks): the signature is every chat
    platform's builder's."""
    if not settings.discord_bot_token:
        return []
    # discord.py is imported only by a server that runs the bot (it is ~0.2 s to import).
    from gateway.surfaces.discord import DiscordAdapter

    turns = chat_turn_service(settings, store, agent, Platform.DISCORD, approvals)
    adapter = DiscordAdapter(
        token=settings.discord_bot_token,
        turns=turns,
        allowed_users=settings.discord_allowed_user_ids,
        api_base=settings.discord_api_base,
        approvals=approvals,
        records=TelegramState(state) if state is not None else None,
    )
    if metrics is not None:
        metrics.watch_turns(Platform.DISCORD.value, turns)
    return [adapter]


DISCORD = ChatPlatform(
    name="discord",
    configured=lambda settings: bool(settings.discord_bot_token),
    build=discord_surfaces,
)
