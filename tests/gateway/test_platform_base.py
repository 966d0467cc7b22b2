"""MessageEvent defaults and the BasePlatformAdapter contract."""

from __future__ import annotations

import time
from typing import Any

import pytest

from gateway.adapter import BasePlatformAdapter, MessageEvent, MessageType
from gateway.config import Platform
from gateway.session import SessionSource
from gateway.wake import adapter_supports_push


class EchoAdapter(BasePlatformAdapter):
    platform = Platform.LOCAL

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, str]] = []

    async def send(self, chat_id: str, text: str, *, metadata: dict[str, Any] | None = None) -> Any:
        self.sent.append((chat_id, text))
        return "m1"


def test_message_event_defaults() -> None:
    before = time.time()
    evt = MessageEvent(text="hi")
    assert evt.message_type is MessageType.TEXT
    assert evt.source is None and evt.internal is False and evt.session_id is None
    assert evt.metadata == {} and evt.metadata is not MessageEvent(text="x").metadata
    assert before <= evt.created_at <= time.time()
    assert MessageType.COMMAND == "command"


async def test_handle_message_calls_handler() -> None:
    adapter = EchoAdapter()
    seen: list[MessageEvent] = []

    async def handler(event: MessageEvent) -> str | None:
        seen.append(event)
        return "reply"

    adapter.set_message_handler(handler)
    evt = MessageEvent(text="x", source=SessionSource(Platform.LOCAL, chat_id="c"))
    assert await adapter.handle_message(evt) == "reply"
    assert seen == [evt]
    assert await adapter.send("c", "t") == "m1"
    await adapter.start()
    await adapter.stop()


async def test_handle_message_without_handler_raises() -> None:
    with pytest.raises(RuntimeError, match="no message handler"):
        await EchoAdapter().handle_message(MessageEvent(text="x"))


def test_platform_required_and_override() -> None:
    class Nameless(BasePlatformAdapter):
        async def send(self, chat_id: str, text: str, *, metadata: dict | None = None) -> Any:
            return None

    with pytest.raises(TypeError, match="platform"):
        Nameless()
    assert Nameless(platform=Platform.SMS).platform is Platform.SMS


def test_send_is_abstract() -> None:
    class NoSend(BasePlatformAdapter):
        platform = Platform.LOCAL

    with pytest.raises(TypeError):
        NoSend()  # type: ignore[abstract]


def test_push_flag() -> None:
    class Stateless(EchoAdapter):
        supports_async_delivery = False

    assert adapter_supports_push(EchoAdapter()) is True
    assert adapter_supports_push(Stateless()) is False
