"""Where the bot talks: direct messages, guild channels and threads, each a conversation of
its own; who it answers (the allowed users); what its replies look like (markdown, the
2,000-character split)."""

from __future__ import annotations

from gateway.config import Platform
from gateway.session import SessionSource
from gateway.surfaces.discord.format import code_block, split_message, to_discord
from gateway.surfaces.discord.intake import MemoryRecords, discord_session_id
from tests.discord.conftest import STRANGER, Rig, until
from tests.discord.fake_discord import CHANNEL_ID, GUILD_ID, THREAD_ID

DM = "700000000000000042"


def _session(chat_id: str, chat_type: str, user: str = "42") -> str:
    return discord_session_id(
        SessionSource(platform=Platform.DISCORD, chat_id=chat_id, chat_type=chat_type, user_id=user)
    )


async def test_a_guild_channel_and_its_thread_are_two_conversations(rig: Rig) -> None:
    fake = rig.fake
    await fake.message("in the channel", channel_id=CHANNEL_ID, guild_id=GUILD_ID)
    await until(lambda: fake.texts_to(CHANNEL_ID) == ["one two three four"])
    await fake.message("in the thread", channel_id=THREAD_ID, guild_id=GUILD_ID)
    await until(lambda: fake.texts_to(THREAD_ID) == ["one two three four"])
    channel = rig.store.get_session(_session(CHANNEL_ID, "channel"))
    thread = rig.store.get_session(_session(THREAD_ID, "thread"))
    assert channel is not None and thread is not None
    assert channel.source["chat_name"] == "general"
    assert thread.source["chat_type"] == "thread"
    assert rig.model.turns == ["in the channel", "in the thread"]


async def test_the_bots_own_mention_in_front_is_not_part_of_the_message(rig: Rig) -> None:
    fake = rig.fake
    await fake.message("<@900000000000000001> hello", channel_id=CHANNEL_ID, guild_id=GUILD_ID)
    await until(lambda: fake.texts_to(CHANNEL_ID))
    assert rig.model.turns == ["hello"]


async def test_a_direct_message_is_a_conversation_of_its_own(rig: Rig) -> None:
    await rig.fake.message("hi", channel_id=DM)
    await until(lambda: rig.fake.texts_to(DM))
    session = rig.store.get_session(_session(DM, "dm"))
    assert session is not None and session.source["user_id"] == "42"


async def test_only_allowed_users_are_answered(rig: Rig) -> None:
    fake = rig.fake
    await fake.message("let me in", author=STRANGER, channel_id=CHANNEL_ID, guild_id=GUILD_ID)
    await fake.message("hello", author="42", channel_id=CHANNEL_ID, guild_id=GUILD_ID)
    await until(lambda: fake.texts_to(CHANNEL_ID))
    assert rig.model.turns == ["hello"]
    assert fake.texts_to(CHANNEL_ID) == ["one two three four"]
    assert rig.adapter.ignored_messages == 1


async def test_the_bot_never_answers_bots_or_itself(rig: Rig) -> None:
    fake = rig.fake
    await fake.message("a bot's message", author="900000000000000001", channel_id=DM)
    await fake.message("hello", channel_id=DM)
    await until(lambda: fake.texts_to(DM))
    assert rig.model.turns == ["hello"]


async def test_a_long_reply_is_split_under_2000_characters_with_its_code_block_whole(
    rig: Rig,
) -> None:
    code = "\n".join(f"print({i})  # a line of code" for i in range(150))
    prose = " ".join(["word"] * 400)
    rig.model.reply = f"#### Result\n\n{prose}\n\n```python\n{code}\n```\n\nDone."
    await rig.fake.message("long please", channel_id=DM)
    await until(lambda: (t := rig.fake.texts_to(DM)) and t[-1].endswith("Done."))
    texts = rig.fake.texts_to(DM)
    assert len(texts) >= 3
    assert all(len(t) <= 2000 for t in texts)
    assert texts[0].startswith("**Result**")  # #### is not Discord markdown
    for text in texts:
        assert text.count("```") % 2 == 0  # each piece renders alone
    joined = "\n".join(texts)
    assert all(f"print({i})" in joined for i in range(150))


def test_split_never_loses_text_and_keeps_the_limit() -> None:
    text = ("x" * 2500) + "\n\n" + ("para " * 600) + "\n```\n" + ("y" * 3000) + "\n```"
    pieces = split_message(text)
    assert all(len(p) <= 2000 for p in pieces)
    assert "".join(pieces).count("x") == 2500
    assert "".join(pieces).count("y") == 3000
    assert split_message("") == [""]


def test_markdown_keeps_discord_syntax_and_defuses_fences_in_commands() -> None:
    assert to_discord("**bold** _it_ `code`\n### title") == "**bold** _it_ `code`\n### title"
    assert to_discord("###### deep ##") == "**deep**"
    table = "Results:\n| name | n |\n|---|---:|\n| a | 1 |\n| b | 22 |\nDone."
    assert to_discord(table) == (
        "Results:\n```\n| name | n |\n|---|---:|\n| a | 1 |\n| b | 22 |\n```\nDone."
    )
    assert (
        to_discord("see ![a chart](https://x.test/c.png)") == "see [a chart](https://x.test/c.png)"
    )
    inside = "```\n#### not a heading\n| a |\n|---|\n```"
    assert to_discord(inside) == inside  # code is left as it is
    for text in (table, inside, "#### h\n![i](u)"):
        assert to_discord(to_discord(text)) == to_discord(text)
    long_table = "| k | v |\n|---|---|\n" + "\n".join(f"| {i} | {'x' * 30} |" for i in range(120))
    pieces = split_message(long_table)
    assert len(pieces) > 1 and all(len(p) <= 2000 for p in pieces)
    assert all(p.startswith("```") and p.endswith("```") for p in pieces)
    block = code_block("echo ``` done")
    assert block.count("```") == 2  # the command's own fence cannot close the block


def test_reply_records_are_kept_for_a_while_then_forgotten() -> None:
    records = MemoryRecords(keep_seconds=0.0)
    records.record_part("k1", 0, "c", 11)
    records.finish_reply("k1")
    assert records.reply_finished("k1")  # kept while it is the newest
    records.finish_reply("k2")  # a later reply: k1 is past keep_seconds now
    assert not records.reply_finished("k1")
    kept = MemoryRecords()
    kept.record_part("k", 0, "c", 11)
    kept.record_part("k", 1, "c", 12)
    assert kept.reply_parts("k") == {0: 11, 1: 12}
    kept.finish_reply("k")
    assert kept.reply_finished("k") and kept.reply_parts("k") == {}
