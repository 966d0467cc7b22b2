"""`reveille serve` with the Discord surface against the stand-in, end to end: a background
result comes home to the Discord chat that asked for it, once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from delivery.rows import LedgerRow
from tests.api_server.serve_support import Server, ledger_rows, wait_until
from tests.discord.fake_discord import ThreadedFakeDiscord

DM = "700000000000000042"


@pytest.fixture
def discord_fake() -> Iterator[ThreadedFakeDiscord]:
    threaded = ThreadedFakeDiscord()
    try:
        yield threaded
    finally:
        threaded.stop()


def _settled(home: Path) -> list[LedgerRow]:
    return [r for r in ledger_rows(home) if r.delivery_state != "pending"]


def test_a_background_result_wakes_the_discord_chat_exactly_once(
    tmp_path: Path, discord_fake: ThreadedFakeDiscord
) -> None:
    fake = discord_fake.fake
    server = Server(
        tmp_path,
        extra_env={
            "DISCORD_BOT_TOKEN": fake.token,
            "DISCORD_API_BASE": fake.api_base,
            "DISCORD_ALLOWED_USERS": "42",
        },
    )
    try:
        wait_until(lambda: fake.identifies, 30)
        banner = "\n".join(server.lines)
        assert f"discord: Gateway via {fake.api_base}; allowed users 42" in banner
        discord_fake.call(
            lambda: fake.message("in the background: count the moons of Mars", channel_id=DM)
        )
        wait_until(lambda: any("Started in the background" in t for t in fake.texts_to(DM)))
        wait_until(lambda: _settled(tmp_path))
        time.sleep(1.0)  # nothing else arrives
        texts = fake.texts_to(DM)
        assert len(texts) == 2, texts
        assert "moons of Mars" in texts[1]
        [row] = ledger_rows(tmp_path)
        assert row.delivery_state == "delivered"
        assert row.delivery_attempts == 1
        assert {c["name"] for c in fake.commands} == {"new", "help"}
    finally:
        server.stop()
