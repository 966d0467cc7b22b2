"""The platforms the contract suite runs against: one line each."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.surfaces.contract import FakePlatform
from tests.surfaces.discord_fake import DiscordPlatform
from tests.surfaces.matrix_fake import MatrixPlatform
from tests.surfaces.slack_fake import SlackPlatform
from tests.surfaces.telegram_fake import TelegramPlatform

PLATFORMS: dict[str, Callable[[], FakePlatform]] = {
    "telegram": TelegramPlatform,
    "discord": DiscordPlatform,
    "matrix": MatrixPlatform,
    "slack": SlackPlatform,
}


@pytest.fixture(params=sorted(PLATFORMS))
def platform(request: pytest.FixtureRequest) -> Iterator[FakePlatform]:
    fake = PLATFORMS[request.param]()
    try:
        yield fake
    finally:
        fake.stop()
