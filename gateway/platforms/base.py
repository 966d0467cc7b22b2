"""Contract path kept for plugins: the platform-adapter contract lives in ``gateway.adapter``."""

from gateway.adapter import (
    BasePlatformAdapter,
    MessageEvent,
    MessageHandler,
    MessageType,
    SendResult,
)

__all__ = ["BasePlatformAdapter", "MessageEvent", "MessageHandler", "MessageType", "SendResult"]
