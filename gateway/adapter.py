"""The platform-adapter contract: inbound ``MessageEvent`` and the adapter base class.

Every surface (chat platforms, the API server, the local console) turns what arrives into a
``MessageEvent`` and hands it to the runner's message handler. Wake-ups reuse the same path
with ``internal=True`` so a completion re-enters the conversation as an ordinary turn.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

from gateway.config import Platform
from gateway.session import SessionSource

__all__ = ["BasePlatformAdapter", "MessageEvent", "MessageHandler", "MessageType", "SendResult"]


class MessageType(StrEnum):
    """What kind of inbound message an event carries."""

    TEXT = "text"
    COMMAND = "command"
    PHOTO = "photo"
    DOCUMENT = "document"
    VOICE = "voice"
    AUDIO = "audio"
    VIDEO = "video"
    STICKER = "sticker"
    LOCATION = "location"


@dataclass
class MessageEvent:
    """One inbound message (or a synthetic wake-up when ``internal`` is True)."""

    text: str
    message_type: MessageType = MessageType.TEXT
    source: SessionSource | None = None
    # True for turns the system starts itself (wake-ups); adapters must not echo them to
    # the chat as if the user had typed them.
    internal: bool = False
    message_id: str | None = None
    # Raw session id for stateless surfaces that address sessions directly.
    session_id: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)


MessageHandler = Callable[[MessageEvent], Awaitable[str | None]]


@dataclass(frozen=True)
class SendResult:
    """What ``send`` reports: adapters return a failed result rather than raising, so a
    caller that sends in a loop (or in a ``finally``) can log it and go on. ``retryable``
    says whether the same send may succeed later (rate limit, network)."""

    success: bool
    message_id: str | None = None
    error: str | None = None
    retryable: bool = False


class BasePlatformAdapter(ABC):
    """Base for platform adapters.

    Subclasses set ``platform`` (class attribute or constructor argument), implement
    ``send`` and usually override ``start``/``stop``. Adapters that cannot push a turn into
    a conversation on their own (the stateless API server) set
    ``supports_async_delivery = False`` so wake-ups take the self-POST path instead.
    """

    platform: Platform
    supports_async_delivery: ClassVar[bool] = True

    def __init__(self, platform: Platform | None = None) -> None:
        if platform is not None:
            self.platform = Platform(platform)
        elif not isinstance(getattr(self, "platform", None), Platform):
            raise TypeError(
                f"{type(self).__name__} must define a `platform` class attribute "
                "or pass platform= to BasePlatformAdapter.__init__"
            )
        self._message_handler: MessageHandler | None = None

    def set_message_handler(self, handler: MessageHandler) -> None:
        """Install the coroutine function that processes inbound events (the runner)."""
        self._message_handler = handler

    async def handle_message(self, event: MessageEvent) -> str | None:
        """Pass an event to the handler and return its reply text.

        Raises RuntimeError when no handler is installed: silently dropping the event would
        lose a wake-up while the caller believes it was delivered.
        """
        handler = self._message_handler
        if handler is None:
            raise RuntimeError(
                f"{type(self).__name__} ({self.platform.value}) has no message handler; "
                "call set_message_handler() before delivering events"
            )
        return await handler(event)

    @abstractmethod
    async def send(self, chat_id: str, text: str, *, metadata: dict[str, Any] | None = None) -> Any:
        """Send ``text`` to ``chat_id`` on this platform; a ``SendResult`` (or the platform's
        message id) on success, a failed ``SendResult`` instead of an exception."""

    async def start(self) -> None:  # noqa: B027 - intentionally optional hook
        """Connect/listen; no-op by default."""

    async def stop(self, *, grace_seconds: float = 10.0) -> None:  # noqa: B027 - optional hook
        """Stop taking new work, give what runs ``grace_seconds`` to finish, disconnect;
        no-op by default. One signature on every surface."""
