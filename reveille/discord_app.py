"""Wiring of the Discord surface, called from the composition root (``reveille.app``).

The root says *that* Discord is wired; this module says *how*: the bot token, the allowed
users and the REST root (``DISCORD_API_BASE``) over the turn service ``chat_platform`` makes
for it. With ``approvals`` its turns ask them (buttons in the chat), holding the session while
one is pending. The store's chat-platform state keeps its reply records and ``/new`` map, so
a restart or another server answers a message once; without it they live in memory.
discord.py is imported only when a token is set (it is ~0.2 s to import).
"""

from __future__ import annotations

from gateway.config import Platform
from gateway.surfaces.port import ChatSurface
from gateway.surfaces.telegram.state import TelegramState
from reveille.chat_platform import PlatformWiring, chat_platform

__all__ = ["DISCORD"]


def _discord(wiring: PlatformWiring) -> ChatSurface:
    from gateway.surfaces.discord import DiscordAdapter

    settings = wiring.settings
    return DiscordAdapter(
        token=settings.discord_bot_token,
        turns=wiring.turns,
        allowed_users=settings.discord_allowed_user_ids,
        api_base=settings.discord_api_base,
        approvals=wiring.approvals,
        records=TelegramState(wiring.state) if wiring.state is not None else None,
    )


DISCORD = chat_platform(
    "discord",
    Platform.DISCORD,
    configured=lambda settings: bool(settings.discord_bot_token),
    make=_discord,
)
