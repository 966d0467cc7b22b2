"""Fixtures of the Telegram tests: the fake Bot API, and `reveille serve` pointed at it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api_server.serve_support import Server
from tests.telegram.fake_bot_api import FakeBotApi

ALLOWED = "42,43"


@pytest.fixture
def bot() -> Iterator[FakeBotApi]:
    fake = FakeBotApi().start()
    try:
        yield fake
    finally:
        fake.hold_sends.clear()
        fake.stop()


def telegram_env(bot: FakeBotApi, **extra: str) -> dict[str, str]:
    return {
        "TELEGRAM_BOT_TOKEN": bot.token,
        "TELEGRAM_BASE_URL": bot.base_url,
        "TELEGRAM_ALLOWED_USERS": ALLOWED,
        "TELEGRAM_EDIT_INTERVAL": "0.05",
        **extra,
    }


def serve(home: Path, bot: FakeBotApi, *, hold_ack: bool = False, **extra: str) -> Server:
    return Server(home, hold_ack=hold_ack, extra_env=telegram_env(bot, **extra))
