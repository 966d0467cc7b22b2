"""Slack's answers for a token that will never work, and the error that stops the start.

A bot token (``auth.test``) or an app-level token (``apps.connections.open``) answered with
one of ``REFUSED_TOKEN_ERRORS`` is wrong, not unlucky: retrying cannot help, so the start
stops with ``SlackTokenRefused`` (one line saying which token and where to get it again).
"""

from __future__ import annotations

__all__ = ["REFUSED_TOKEN_ERRORS", "SlackTokenRefused"]

REFUSED_TOKEN_ERRORS = frozenset(
    {
        "invalid_auth",
        "not_authed",
        "account_inactive",
        "token_revoked",
        "token_expired",
        "not_allowed_token_type",
    }
)


class SlackTokenRefused(RuntimeError):
    """Slack refused a token at start (the bot's or the app-level one)."""
