"""Approvals as buttons (message components, pressed as interactions; decided by the owner
of the conversation only) and ``/new``, ``/timers`` and ``/help`` as application commands."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.config import Platform
from gateway.session import SessionSource
from gateway.surfaces.discord.adapter import HELP_TEXT
from gateway.surfaces.discord.intake import discord_session_id
from gateway.wake import deliver_wake
from tests.discord.conftest import OTHER, STRANGER, Rig, until
from tests.discord.fake_discord import CHANNEL_ID, GUILD_ID, Callback, Sent
from tools.delegation_runtime import configure_runtime, reset_runtime

DM = "700000000000000042"
EPHEMERAL = 64


async def _answer(rig: Rig, interaction_id: str) -> Callback:
    """The bot's response to an interaction, once it has come."""
    await until(lambda: rig.fake.callback_for(interaction_id))
    answer = rig.fake.callback_for(interaction_id)
    assert answer is not None
    return answer


async def _asked(rig: Rig, channel: str) -> Sent:
    await until(lambda: any(rig.fake.buttons(m) for m in rig.fake.messages_to(channel)))
    return next(m for m in rig.fake.messages_to(channel) if rig.fake.buttons(m))


async def test_a_command_is_asked_with_buttons_and_only_the_owner_decides(rig: Rig) -> None:
    fake = rig.fake
    await fake.message("run rm -rf ./build", channel_id=CHANNEL_ID, guild_id=GUILD_ID)
    asked = await _asked(rig, CHANNEL_ID)
    assert "rm -rf ./build" in asked.content
    [(approve_label, approve), (deny_label, deny)] = fake.buttons(asked)
    assert (approve_label, deny_label) == ("Approve once", "Deny")
    assert "rm -rf" not in approve + deny  # the opaque id only
    # Someone else in the channel, allowed or not: told it is not theirs, nothing decided.
    for presser in (OTHER, STRANGER):
        pressed = await fake.press(asked, approve, by=presser, guild_id=GUILD_ID)
        answer = await _answer(rig, pressed)
        assert answer.type == 4
        assert answer.data["content"] == "Not yours to decide."
        assert answer.data["flags"] & EPHEMERAL
    assert fake.buttons(asked)  # still asked
    pressed = await fake.press(asked, approve, by="42", guild_id=GUILD_ID)
    await until(lambda: fake.texts_to(CHANNEL_ID)[-1] == "**ran** `rm -rf ./build`")
    decided = fake.callback_for(pressed)
    assert decided is not None and decided.type == 7  # the question itself is updated
    assert asked.content == "Approved once: `rm -rf ./build`"
    assert fake.buttons(asked) == []
    # A second press on the old buttons is told it was decided.
    again = await fake.press(asked, deny, by="42", guild_id=GUILD_ID)
    await until(lambda: fake.callback_for(again))
    answer = fake.callback_for(again)
    assert answer is not None and answer.data["content"] == "Already decided: approved."


async def test_a_denied_command_does_not_run(rig: Rig) -> None:
    fake = rig.fake
    await fake.message("run make deploy", channel_id=DM)
    asked = await _asked(rig, DM)
    [_, (_, deny)] = fake.buttons(asked)
    await fake.press(asked, deny, by="42")
    await until(lambda: fake.texts_to(DM)[-1] == "not run: denied")
    assert asked.content == "Denied (not run): `make deploy`"


async def test_help_is_an_application_command_answered_to_its_user(rig: Rig) -> None:
    used = await rig.fake.command("help", by="42")
    await until(lambda: rig.fake.callback_for(used))
    answer = rig.fake.callback_for(used)
    assert answer is not None and answer.type == 4
    assert answer.data["content"] == HELP_TEXT
    assert answer.data["flags"] & EPHEMERAL
    assert rig.model.turns == []  # no turn


async def test_timers_is_an_application_command_listing_the_chats_reminders(
    rig: Rig, tmp_path: Path
) -> None:
    configure_runtime(str(tmp_path / "ledger.db"))
    try:
        used = await rig.fake.command("timers", by="42", channel_id=DM)
        await until(lambda: rig.fake.callback_for(used))
        answer = rig.fake.callback_for(used)
        assert answer is not None and answer.data["content"] == "Nothing is scheduled here."
        assert rig.model.turns == []  # no turn
    finally:
        reset_runtime()


async def test_new_starts_a_fresh_session_and_keeps_the_old_one(rig: Rig) -> None:
    fake = rig.fake
    source = SessionSource(platform=Platform.DISCORD, chat_id=DM, chat_type="dm", user_id="42")
    old = discord_session_id(source)
    first = await fake.message("remember 7", channel_id=DM)
    await until(lambda: rig.adapter.records.reply_finished(f"discord:message:{first}"))
    used = await fake.command("new", by="42", channel_id=DM)
    await until(lambda: fake.callback_for(used))
    answer = fake.callback_for(used)
    assert answer is not None and "Started a new conversation" in answer.data["content"]
    assert old in answer.data["content"]
    await fake.message("what did I say?", channel_id=DM)
    await until(lambda: len(fake.texts_to(DM)) == 2)
    fresh = rig.adapter.records.chat_session(old)
    assert fresh is not None and fresh.startswith(old + ":new-")
    assert rig.store.get_session(fresh) is not None
    assert rig.store.get_session(old) is not None  # kept, readable


async def test_commands_from_users_not_allowed_are_refused(rig: Rig) -> None:
    used = await rig.fake.command("new", by=STRANGER, channel_id=DM)
    await until(lambda: rig.fake.callback_for(used))
    answer = rig.fake.callback_for(used)
    assert answer is not None and answer.data["flags"] & EPHEMERAL
    assert "not on this bot's list" in answer.data["content"]
    assert (
        rig.adapter.records.chat_session(
            discord_session_id(
                SessionSource(
                    platform=Platform.DISCORD, chat_id=DM, chat_type="dm", user_id=STRANGER
                )
            )
        )
        is None
    )


async def test_a_wake_up_waits_behind_a_pending_approval_and_runs_once_after(rig: Rig) -> None:
    fake = rig.fake
    source = SessionSource(platform=Platform.DISCORD, chat_id=DM, chat_type="dm", user_id="42")
    await fake.message("run make test", channel_id=DM)
    asked = await _asked(rig, DM)
    wake = asyncio.create_task(
        deliver_wake(
            rig.adapter,
            text="[reveille:wake] the build finished",
            source=source,
            session_id=discord_session_id(source),
            idempotency_key="deleg_gated",
        )
    )
    for _ in range(20):
        await asyncio.sleep(0.01)
    assert not wake.done()  # held: the turn waiting for a person keeps the chat
    assert "[reveille:wake] the build finished" not in rig.model.turns
    [(_, approve), _] = fake.buttons(asked)
    await fake.press(asked, approve, by="42")
    await wake
    assert rig.model.turns == ["run make test", "[reveille:wake] the build finished"]
    assert fake.texts_to(DM)[-1] == "one two three four"
