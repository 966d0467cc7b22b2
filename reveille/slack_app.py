"""Wiring of the Slack surface, called from the composition root (``reveille.app``).

The root says *that* Slack is wired; this module says *how*: the bot token, Socket Mode's
app-level token, the signing secret (whose routes, ``/slack/events`` and
``/slack/interactivity``, it mounts on the API server's port: each request is signed, so
they need no API key), the Web API root and the allowed users, over the turn service
``chat_platform`` makes for it and the store's chat-platform state (the inbox, the lease,
reply records: required, so that an event is answered once across restarts and servers).
slack-sdk is imported only when a bot token is set.
"""

from __future__ import annotations

from gateway.config import Platform
from gateway.surfaces.port import ChatSurface
from gateway.surfaces.telegram.state import TelegramState
from reveille.chat_platform import PlatformWiring, chat_platform

__all__ = ["SLACK"]


def _slack(wiring: PlatformWiring) -> ChatSurface:
    from gateway.surfaces.slack import SlackAdapter

    settings, state = wiring.settings, wiring.state
    assert state is not None  # needs_state
    adapter = SlackAdapter(
        bot_token=settings.slack_bot_token,
        app_token=settings.slack_app_token,
        signing_secret=settings.slack_signing_secret,
        base_url=settings.slack_base_url,
        turns=wiring.turns,
        records=TelegramState(state),
        allowed_users=settings.slack_allowed_user_ids,
        approvals=wiring.approvals,
    )
    if wiring.api_server is not None:
        for path, handler in adapter.routes():
            wiring.api_server.add_public_route(path, handler)  # signed: its own key
    return adapter


SLACK = chat_platform(
    "slack",
    Platform.SLACK,
    configured=lambda settings: bool(settings.slack_bot_token),
    make=_slack,
    needs_state=True,
)
