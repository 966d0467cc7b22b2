"""Wake-ups in a Discord chat, and how Discord's refusals are honoured: a 429's
``Retry-After`` waited out, a channel the bot may no longer write to (50013) or that is gone
(10003) dropped with Discord's reason."""

from __future__ import annotations

import logging

import pytest

from gateway.config import Platform
from gateway.session import SessionGone, SessionSource
from gateway.surfaces.discord.intake import discord_session_id
from gateway.wake import WakeDeliveryError, deliver_wake
from tests.discord.conftest import Rig, until

DM = "700000000000000042"
SOURCE = SessionSource(platform=Platform.DISCORD, chat_id=DM, chat_type="dm", user_id="42")


async def _talked(rig: Rig) -> str:
    """A conversation in the DM (a wake-up continues a session, never starts one)."""
    message_id = await rig.fake.message("hi", channel_id=DM)
    key = f"discord:message:{message_id}"
    await until(lambda: rig.adapter.records.reply_finished(key))  # the chat is free again
    return discord_session_id(SOURCE)


async def _wake(rig: Rig, session_id: str, key: str) -> None:
    await deliver_wake(
        rig.adapter,
        text=f"[reveille:wake] {key} finished",
        source=SOURCE,
        session_id=session_id,
        idempotency_key=key,
    )


def _posts(rig: Rig, channel: str) -> list[float]:
    path = f"/api/v10/channels/{channel}/messages"
    return [at for method, p, at in rig.fake.requests if method == "POST" and p == path]


async def test_a_wake_up_is_a_turn_in_the_chat_delivered_once(rig: Rig) -> None:
    session_id = await _talked(rig)
    for _ in range(2):  # the same delivery offered twice
        await _wake(rig, session_id, "deleg_abc")
    assert rig.model.turns == ["hi", "[reveille:wake] deleg_abc finished"]
    assert len(rig.fake.texts_to(DM)) == 2
    assert rig.adapter.turns.wake_turns == 1


@pytest.mark.parametrize(
    ("status", "code", "words"),
    [(403, 50013, "Missing Permissions"), (404, 10003, "Unknown Channel")],
)
async def test_a_wake_up_to_a_chat_the_bot_lost_is_dropped_with_discords_reason(
    rig: Rig, status: int, code: int, words: str
) -> None:
    session_id = await _talked(rig)
    rig.fake.fail(DM, status, code, words, times=5)
    with pytest.raises(SessionGone) as info:
        await _wake(rig, session_id, "deleg_gone")
    assert f"{words} ({code})" in str(info.value.reason)
    assert len(_posts(rig, DM)) == 2  # the one refused send, never repeated


@pytest.mark.parametrize(
    ("status", "code", "words"),
    [(403, 50013, "Missing Permissions"), (404, 10003, "Unknown Channel")],
)
async def test_a_reply_to_a_chat_the_bot_lost_is_dropped_and_logged(
    rig: Rig, caplog: pytest.LogCaptureFixture, status: int, code: int, words: str
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.surfaces.chat")
    rig.fake.fail(DM, status, code, words)
    await rig.fake.message("hello?", channel_id=DM)
    await until(lambda: f"{words} ({code})" in caplog.text)
    assert "is gone" in caplog.text
    assert len(_posts(rig, DM)) == 1  # dropped, not retried
    # The chat is not stuck: the next message is answered.
    await rig.fake.message("again", channel_id=DM)
    await until(lambda: rig.fake.texts_to(DM) == ["one two three four"])


async def test_a_429_is_waited_out_for_its_retry_after_and_sent_once(rig: Rig) -> None:
    rig.fake.rate_limit(DM, 0.25)
    await rig.fake.message("hi", channel_id=DM)
    await until(lambda: rig.fake.texts_to(DM) == ["one two three four"])
    first, second = _posts(rig, DM)
    assert second - first >= 0.25  # sent again only after Retry-After
    assert len(rig.fake.messages_to(DM)) == 1


async def test_a_long_429_releases_a_wake_up_retryably_after_waiting(rig: Rig) -> None:
    session_id = await _talked(rig)
    rig.adapter.chat.wake_wait_seconds = 0.2  # the most a wake-up waits before release
    rig.fake.rate_limit(DM, 120.0)  # beyond what discord.py waits out itself
    with pytest.raises(WakeDeliveryError) as info:
        await _wake(rig, session_id, "deleg_slow")
    assert info.value.transient and info.value.status == 429
    # Offered again, the stored turn is replayed (not run twice) and its reply sent.
    await _wake(rig, session_id, "deleg_slow")
    assert rig.model.turns.count("[reveille:wake] deleg_slow finished") == 1
    assert rig.fake.texts_to(DM)[-1] == "one two three four"
