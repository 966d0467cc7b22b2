"""The Discord adapter connects to the stand-in through discord.py's own settings and
answers a direct message."""

from __future__ import annotations

import asyncio

import pytest

from gateway.session import SessionStore
from gateway.surfaces.discord import DiscordAdapter
from gateway.surfaces.discord import adapter as discord_adapter
from gateway.surfaces.discord.adapter import DiscordTokenRefused
from gateway.surfaces.port import ChatSurface
from gateway.turns.service import TurnService
from tests.discord.conftest import Rig, ScriptedModel, until
from tests.discord.fake_discord import APP_ID, BOT_ID, TOKEN, FakeDiscord
from tests.ports import free_port
from tests.stores import memory_sessions

DM = "700000000000000042"


async def test_the_adapter_implements_the_surface_port(rig: Rig) -> None:
    assert isinstance(rig.adapter, ChatSurface)
    assert rig.adapter.limits.max_message_chars == 2000 and rig.adapter.limits.can_edit


async def test_the_bot_identifies_gets_ready_and_registers_its_commands(rig: Rig) -> None:
    fake = rig.fake
    assert len(fake.identifies) == 1
    intents = fake.identifies[0]["intents"]
    assert intents & (1 << 15)  # MESSAGE_CONTENT
    assert intents & (1 << 12)  # DIRECT_MESSAGES
    assert rig.adapter.bot == BOT_ID
    await until(lambda: {c["name"] for c in fake.commands} == {"new", "timers", "help"})
    assert ("PUT", f"/api/v10/applications/{APP_ID}/commands") in [
        (m, p) for m, p, _ in fake.requests
    ]


async def test_a_direct_message_is_answered_once(rig: Rig) -> None:
    fake = rig.fake
    await fake.message("hi", author="42", channel_id=DM)
    await until(lambda: fake.texts_to(DM) == ["one two three four"])
    [sent] = fake.messages_to(DM)
    assert rig.model.turns == ["hi"]
    assert sent.allowed_mentions == {"parse": []}  # nobody pinged by model output
    assert DM in fake.typing


async def test_heartbeats_are_acknowledged(rig: Rig) -> None:
    # discord.py beats once as soon as HELLO arrives, then every heartbeat_interval.
    await until(lambda: rig.fake.heartbeats >= 1)
    assert rig.adapter.client.latency >= 0  # an ACK came back: the latency is measured


async def test_a_dropped_socket_is_resumed_and_what_it_missed_is_answered_once(rig: Rig) -> None:
    fake = rig.fake
    await fake.message("before", channel_id=DM)
    await until(lambda: len(fake.texts_to(DM)) == 1)
    await fake.drop()
    # Pushed while the bot is away: kept by the stand-in, replayed after RESUME.
    await fake.message("while away", channel_id=DM)
    await fake.wait_connected()
    await until(lambda: len(fake.texts_to(DM)) == 2)
    assert len(fake.identifies) == 1  # resumed, not identified again
    [resume] = fake.resumes
    assert resume["session_id"] == fake.session_id
    assert resume["seq"] >= 3  # READY, GUILD_CREATE, the first message
    assert rig.model.turns == ["before", "while away"]


async def test_a_refused_token_is_said_at_start_and_nothing_is_left_open() -> None:
    fake = await FakeDiscord().start()
    store = SessionStore(memory_sessions())
    turns = TurnService(store, ScriptedModel(), render=lambda r: {"content": r.content})
    adapter = DiscordAdapter(token="wrong", turns=turns, api_base=fake.api_base)
    try:
        with pytest.raises(DiscordTokenRefused, match="DISCORD_BOT_TOKEN"):
            await adapter.start()
        assert adapter.client.is_closed()
        assert fake.identifies == []
    finally:
        store.close()
        await fake.stop()


async def test_discord_unreachable_at_start_does_not_stop_the_server_and_is_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(discord_adapter, "LOGIN_RETRY_SECONDS", 0.05)
    port = free_port()  # nobody listens on it (yet)
    store = SessionStore(memory_sessions())
    turns = TurnService(store, ScriptedModel(), render=lambda r: {"content": r.content})
    adapter = DiscordAdapter(
        token=TOKEN,
        turns=turns,
        allowed_users=frozenset({"42"}),
        api_base=f"http://127.0.0.1:{port}/api/v10",
    )
    await adapter.start()  # returns: the API server goes on starting
    fake = await FakeDiscord().start(port=port)  # Discord is back
    try:
        await fake.wait_connected()
        await fake.message("hi", channel_id=DM)
        await until(lambda: fake.texts_to(DM) == ["one two three four"])
    finally:
        await adapter.stop(grace_seconds=1)
        store.close()
        await fake.stop()


async def test_stop_lets_an_answer_in_flight_finish_and_takes_no_new_message(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    fake = rig.fake
    release = rig.model.gate = asyncio.Event()
    await fake.message("slow one", channel_id=DM)
    await until(lambda: rig.model.turns == ["slow one"])  # its turn is running
    stopping = asyncio.create_task(rig.adapter.stop(grace_seconds=10))
    await asyncio.sleep(0)  # stop has begun: it takes no more messages
    await fake.message("too late", channel_id=DM)
    await until(lambda: "not taken" in caplog.text)
    release.set()
    await stopping
    assert fake.texts_to(DM) == ["one two three four"]
    assert rig.model.turns == ["slow one"]


async def test_a_message_dispatched_twice_is_answered_once(rig: Rig) -> None:
    fake = rig.fake
    first = await fake.message("hi", channel_id=DM)
    await until(lambda: rig.adapter.records.reply_finished(f"discord:message:{first}"))
    await fake.message("hi", channel_id=DM, message_id=first)  # the same event again
    await fake.message("next", channel_id=DM)
    await until(lambda: rig.model.turns == ["hi", "next"] and len(fake.texts_to(DM)) == 2)
    later = await fake.message("last", channel_id=DM)
    await until(lambda: rig.adapter.records.reply_finished(f"discord:message:{later}"))
    assert len(fake.texts_to(DM)) == 3  # "hi" was answered once
