"""Gateway configuration primitives: the set of platforms a session can originate from.

``Platform`` values are persisted (session sources, routing keys, ledger rows), so the
string values are part of the on-disk contract and must never be renamed. ``StrEnum`` (a
``str`` + ``Enum``) so members compare equal to, format as and serialise like their value.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Platform"]


class Platform(StrEnum):
    """A surface a conversation can arrive through; the value is the lowercase name."""

    TELEGRAM = "telegram"
    DISCORD = "discord"
    SLACK = "slack"
    WHATSAPP = "whatsapp"
    SIGNAL = "signal"
    MATRIX = "matrix"
    EMAIL = "email"
    SMS = "sms"
    API_SERVER = "api_server"
    WEBUI = "webui"
    LOCAL = "local"
