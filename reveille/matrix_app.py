"""Wiring of the Matrix surface, called from the composition root (``reveille.app``).

The root says *that* Matrix is wired; this module says *how*: its own ``TurnService`` of
``Platform.MATRIX`` over the agent the root built for it, the homeserver, the bot's account
and its login, the allowed users, and the store's chat-platform state (reply records, the
chat map, the ``/sync`` token and the device). mautrix is imported only when a homeserver is
set.
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

__all__ = ["MATRIX", "matrix_surfaces"]


def matrix_surfaces(
    settings: Settings,
    store: SessionStore,
    agent: Agent,
    api_server: ApiServerAdapter | None = None,
    metrics: Any = None,
    *,
    state: TelegramBackend | None = None,
    approvals: Approvals | None = None,
) -> list[ChatSurface]:
    """The Matrix adapter when a homeserver is configured, else nothing. ``state`` (the
    store's chat-platform state, which the root opens whenever a chat platform is set) is
    required: the ``/sync`` token must outlive the process. ``api_server`` is unused."""
    if not settings.matrix_homeserver:
        return []
    if state is None:
        raise RuntimeError("Matrix needs the store's chat-platform state")
    from gateway.surfaces.matrix import MatrixAdapter

    turns = chat_turn_service(settings, store, agent, Platform.MATRIX, approvals)
    adapter = MatrixAdapter(
        homeserver=settings.matrix_homeserver,
        user_id=settings.matrix_user_id,
        access_token=settings.matrix_access_token,
        password=settings.matrix_password,
        turns=turns,
        state=state,
        records=TelegramState(state),
        allowed_users=settings.matrix_allowed_user_ids,
        approvals=approvals,
    )
    if metrics is not None:
        metrics.watch_turns(Platform.MATRIX.value, turns)
    return [adapter]


MATRIX = ChatPlatform(
    name="matrix",
    configured=lambda settings: bool(settings.matrix_homeserver),
    build=matrix_surfaces,
)
