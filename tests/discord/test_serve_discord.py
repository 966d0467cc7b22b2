"""`reveille serve` with the Discord surface against the stand-in, end to end: a background
result comes home to the Discord chat that asked for it, once."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from delivery.rows import LedgerRow
from gateway.config import Platform
from gateway.session import SessionSource
from gateway.surfaces.discord.intake import discord_session_id
from tests.api_server.serve_support import Server, call, ledger_rows, wait_until
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
        assert {c["name"] for c in fake.commands} == {"new", "timers", "help"}
    finally:
        server.stop()


def test_a_message_taken_by_a_killed_server_is_answered_once_by_the_next(
    tmp_path: Path, discord_fake: ThreadedFakeDiscord
) -> None:
    fake = discord_fake.fake
    env = {
        "DISCORD_BOT_TOKEN": fake.token,
        "DISCORD_API_BASE": fake.api_base,
        "DISCORD_ALLOWED_USERS": "42",
    }
    fake.holding = True  # the reply cannot reach the chat before the kill
    first = Server(tmp_path, extra_env=env)
    wait_until(lambda: fake.identifies, 30)
    discord_fake.call(lambda: fake.message("hello there", channel_id=DM))
    wait_until(lambda: fake.held >= 1)
    first.stop(signal.SIGKILL)
    fake.discard_held = True
    fake.holding = False
    time.sleep(0.2)
    assert fake.texts_to(DM) == []  # lost with its server
    fake.discard_held = False
    # Discord does not deliver the message to the next connection: it is read back.
    second = Server(tmp_path, extra_env=env)
    try:
        wait_until(lambda: any("hello there" in t for t in fake.texts_to(DM)), 30)
        time.sleep(1.0)
        assert len(fake.texts_to(DM)) == 1, fake.texts_to(DM)
        # One turn: the second server answered from the turn the first one stored.
        source = SessionSource(platform=Platform.DISCORD, chat_id=DM, chat_type="dm", user_id="42")
        status, _, data = call(
            second.port, "GET", f"/api/sessions/{discord_session_id(source)}/messages"
        )
        assert status == 200, data
        assert [m["content"] for m in data["data"] if m["role"] == "user"] == ["hello there"]
    finally:
        second.stop()
    third = Server(tmp_path, extra_env=env)  # answered: a further start reads back nothing
    try:
        wait_until(lambda: len(fake.identifies) == 3, 30)
        time.sleep(3.0)  # READY waits ~2 s for guilds, then the read-back
        assert len(fake.texts_to(DM)) == 1
    finally:
        third.stop()
