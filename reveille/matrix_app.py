"""Wiring of the Matrix surface, called from the composition root (``reveille.app``).

The root says *that* Matrix is wired; this module says *how*: the homeserver, the bot's
account and its login, the allowed users, and the store's chat-platform state (reply records,
the chat map, the ``/sync`` token and the device: required, the token must outlive the
process) over the turn service ``chat_platform`` makes for it. mautrix is imported only when
a homeserver is set.
"""

from __future__ import annotations

from gateway.config import Platform
from gateway.surfaces.port import ChatSurface
from gateway.surfaces.telegram.state import TelegramState
from reveille.chat_platform import PlatformWiring, chat_platform

__all__ = ["MATRIX"]


def _matrix(wiring: PlatformWiring) -> ChatSurface:
    from gateway.surfaces.matrix import MatrixAdapter

    settings, state = wiring.settings, wiring.state
    assert state is not None  # needs_state
    return MatrixAdapter(
        homeserver=settings.matrix_homeserver,
        user_id=settings.matrix_user_id,
        access_token=settings.matrix_access_token,
        password=settings.matrix_password,
        turns=wiring.turns,
        state=state,
        records=TelegramState(state),
        allowed_users=settings.matrix_allowed_user_ids,
        approvals=wiring.approvals,
    )


MATRIX = chat_platform(
    "matrix",
    Platform.MATRIX,
    configured=lambda settings: bool(settings.matrix_homeserver),
    make=_matrix,
    needs_state=True,
)
