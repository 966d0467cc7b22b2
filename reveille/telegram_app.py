"""Wiring of the Telegram surface, called from the composition root (``reveille.app``).

Kept apart from ``reveille.app`` so that the root only says *that* Telegram is wired, and
this module *how*: its own ``TurnService`` of ``Platform.TELEGRAM`` (the same turn code as
the API server) over the agent the root built for it, the Bot API client, its durable state
in the store (the ``TelegramBackend`` the root opened: shared by every server on the store),
and (webhook mode) the webhook route on the API server's port.
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
from gateway.surfaces.telegram.adapter import TelegramAdapter
from gateway.surfaces.telegram.api import TelegramApi
from gateway.surfaces.telegram.state import TelegramState
from reveille.chat_platform import ChatPlatform, chat_turn_service
from reveille.settings import Settings

__all__ = ["TELEGRAM", "telegram_surfaces"]


def telegram_surfaces(
    settings: Settings,
    store: SessionStore,
    agent: Agent,
    api_server: ApiServerAdapter,
    metrics: Any = None,
    *,
    state: TelegramBackend | None = None,
    approvals: Approvals | None = None,
) -> list[ChatSurface]:
    """The Telegram adapter over ``state`` when a bot token is configured, else nothing. With
    ``approvals`` its turns ask them (an inline keyboard in the chat), holding the session
    while one is pending."""
    if not settings.telegram_bot_token or state is None:
        return []
    turns = chat_turn_service(settings, store, agent, Platform.TELEGRAM, approvals)
    adapter = TelegramAdapter(
        api=TelegramApi(settings.telegram_bot_token, base_url=settings.telegram_base_url),
        turns=turns,
        state=TelegramState(state),
        allowed_users=settings.telegram_allowed_user_ids,
        webhook_url=settings.telegram_webhook_url,
        secret_token=settings.telegram_secret_token,
        edit_interval=settings.telegram_edit_interval,
        approvals=approvals,
    )
    if settings.telegram_webhook_url:
        path, handler = adapter.webhook_route()
        api_server.add_public_route(path, handler)  # its secret token is its key
    if metrics is not None:
        metrics.watch_turns(Platform.TELEGRAM.value, turns)
    return [adapter]


TELEGRAM = ChatPlatform(
    name="telegram",
    configured=lambda settings: bool(settings.telegram_bot_token),
    build=telegram_surfaces,
)
