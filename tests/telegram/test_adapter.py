"""The Telegram adapter in this process, over a real TurnService and the fake Bot API:
streamed replies, long replies, the typing action, wake-ups and the error mapping."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gateway.adapter import MessageEvent
from gateway.config import Platform
from gateway.session import SessionGone, SessionSource, SessionStore
from gateway.surfaces.telegram.adapter import TelegramAdapter, telegram_session_id
from gateway.surfaces.telegram.api import TelegramApi
from gateway.surfaces.telegram.state import TelegramState
from gateway.turns.service import TurnService
from gateway.wake import WakeDeliveryError, deliver_wake
from tests.api_server.serve_support import wait_until
from tests.stores import memory_sessions, telegram_backend
from tests.telegram.fake_bot_api import FakeBotApi


@dataclass
class _Result:
    content: str
    usage: Any = None


class ScriptedModel:
    """Answers every turn with ``reply``, streamed in ``pieces`` with a pause between."""

    def __init__(self, reply: str = "one two three four", pause: float = 0.05) -> None:
        self.reply = reply
        self.pause = pause
        self.turns: list[str] = []

    async def __call__(self, messages, ctx, on_delta):
        self.turns.append(messages[-1]["content"])
        if on_delta is not None:
            for word in self.reply.split(" "):
                await on_delta(word + " ")
                await asyncio.sleep(self.pause)
        return _Result(self.reply)


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[tuple[TelegramAdapter, FakeBotApi, ScriptedModel]]:
    bot = FakeBotApi().start()
    model = ScriptedModel()
    store = SessionStore(memory_sessions())
    turns = TurnService(
        store,
        model,
        render=lambda r: {"content": r.content},
        platform=Platform.TELEGRAM,
        session_key_of=lambda s: s,
    )
    adapter = TelegramAdapter(
        api=TelegramApi(bot.token, base_url=bot.base_url),
        turns=turns,
        state=TelegramState(telegram_backend("sqlite", tmp_path)),
        allowed_users=frozenset({"42"}),
        edit_interval=0.01,
        poll_timeout=1,
    )
    await adapter.start()
    try:
        yield adapter, bot, model
    finally:
        await adapter.stop(grace_seconds=1)
        adapter.state.close()
        store.close()
        bot.stop()


async def until(check, timeout: float = 10.0) -> None:
    await asyncio.to_thread(wait_until, check, timeout)


SOURCE = SessionSource(platform=Platform.TELEGRAM, chat_id="42", user_id="42")


async def test_a_reply_streams_by_editing_one_message(setup):
    _, bot, model = setup
    bot.message("hi")
    await until(lambda: bot.texts_to(42) == ["one two three four"])
    [sent] = bot.messages_to(42)
    assert sent.edits >= 1  # streamed: sent once, then edited
    assert ("42", "typing") in bot.actions
    assert model.turns == ["hi"]


async def test_a_long_reply_is_split_on_paragraphs_and_escaped(setup):
    _, bot, model = setup
    paragraph = ("<b>word</b> & " * 120).strip()  # ~1,700 characters, ~2,900 escaped
    model.reply = "\n\n".join([paragraph] * 4)
    model.pause = 0
    bot.message("a long one")
    await until(lambda: len(bot.texts_to(42)) >= 4)
    await asyncio.sleep(0.3)
    texts = bot.texts_to(42)
    assert all(len(t) <= 4096 for t in texts)
    assert "<b>" not in "".join(texts)
    assert texts[0].startswith("&lt;b&gt;word&lt;/b&gt; &amp;")
    assert len(texts) == 4


async def test_a_wake_up_is_a_turn_sent_to_the_chat_once(setup):
    adapter, bot, model = setup
    bot.message("hi")
    await until(lambda: bot.texts_to(42))
    session_id = telegram_session_id(SOURCE)
    for _ in range(2):  # the same delivery offered twice
        await deliver_wake(
            adapter,
            text="[reveille:wake] done",
            source=SOURCE,
            session_id=session_id,
            idempotency_key="deleg_abc",
        )
    assert model.turns == ["hi", "[reveille:wake] done"]
    assert len(bot.texts_to(42)) == 2
    assert adapter.turns.wake_turns == 1


async def test_platform_errors_map_onto_the_ledger_rules(setup):
    adapter, bot, model = setup
    bot.message("hi")
    await until(lambda: bot.texts_to(42))
    session_id = telegram_session_id(SOURCE)

    async def wake(key: str) -> None:
        await adapter.handle_message(
            MessageEvent(
                text="[reveille:wake] x",
                source=SOURCE,
                internal=True,
                session_id=session_id,
                metadata={"idempotency_key": key},
            )
        )

    # A failure while streaming only stops the streaming; the final send decides.
    for _ in range(2):
        bot.fail("sendMessage", 502, "Bad Gateway")
    with pytest.raises(WakeDeliveryError) as info:
        await wake("k1")
    assert info.value.transient
    for _ in range(2):
        bot.fail("sendMessage", 400, "Bad Request: message thread not found")
    with pytest.raises(WakeDeliveryError) as info:
        await wake("k2")
    assert not info.value.transient
    bot.fail("sendMessage", 400, "Bad Request: chat not found")
    with pytest.raises(SessionGone):
        await wake("k3")
    loop = asyncio.get_running_loop()
    started = loop.time()
    bot.fail("sendMessage", 429, "Too Many Requests: retry after 1", retry_after=1)
    with pytest.raises(WakeDeliveryError) as info:
        await wake("k4")
    assert info.value.transient and info.value.status == 429
    assert loop.time() - started >= 1.0
    # Each refused wake-up ran its turn once; a retry replays it and sends the reply.
    turns_before = len(model.turns)
    await wake("k4")
    assert len(model.turns) == turns_before
    assert bot.texts_to(42)[-1] == "one two three four"


async def test_a_wake_up_for_a_deleted_session_is_gone(setup):
    adapter, bot, _ = setup
    other = SessionSource(platform=Platform.TELEGRAM, chat_id="99", user_id="99")
    with pytest.raises(SessionGone):
        await deliver_wake(
            adapter,
            text="[reveille:wake] x",
            source=other,
            session_id=telegram_session_id(other),
            idempotency_key="d",
        )
    assert bot.messages_to(99) == []


async def test_each_forum_topic_is_a_session_of_its_own(setup):
    adapter, bot, _ = setup
    for thread in (5, 6):
        bot.message(
            f"topic {thread}", chat_id=-100123, message_thread_id=thread, is_topic_message=True
        )
    await until(lambda: len(bot.messages_to(-100123)) == 2)
    assert sorted(m.thread_id for m in bot.messages_to(-100123)) == [5, 6]
    store = adapter.turns.store
    await until(lambda: adapter.turns.turns_stored == 2)
    for thread in (5, 6):
        session = store.get_session(f"agent:main:telegram:supergroup:-100123:thread:{thread}")
        assert session is not None
        first = store.messages(session.id)[0]
        assert first.role == "user" and first.content == f"topic {thread}"


# An update id no Bot API gives (a broken or hostile relay): out of range, not a number, none.
BAD_UPDATE_IDS: list[Any] = [-5, 2**63, 2**64 + 7, "1001", 1001.0, None, True]


def _bad(update_id: Any, text: str) -> dict[str, Any]:
    message = {"message_id": 1, "chat": {"id": 42, "type": "private"}, "text": text}
    update: dict[str, Any] = {"message": {**message, "from": {"id": 42, "is_bot": False}}}
    if update_id is not None:
        update["update_id"] = update_id
    return update


async def test_updates_with_impossible_ids_are_skipped_and_recorded_once(setup, caplog):
    """One update with an out-of-range id blocked every later update (the offset never moved,
    the same traceback came every second); now it is skipped, logged once, and later good
    updates are answered."""
    adapter, bot, model = setup
    caplog.set_level("WARNING", logger="gateway.surfaces.telegram.intake")
    for i, update_id in enumerate(BAD_UPDATE_IDS):
        bot.raw_update(_bad(update_id, f"bad {i}"))
        bot.message(f"good {i}")
    await until(lambda: len(bot.texts_to(42)) == len(BAD_UPDATE_IDS))
    assert sorted(model.turns) == sorted(f"good {i}" for i in range(len(BAD_UPDATE_IDS)))
    await until(lambda: not bot.updates)  # every one confirmed: getUpdates is not stuck
    assert adapter.poller.skipped == len(BAD_UPDATE_IDS)
    skips = [r for r in caplog.records if "skipped" in r.getMessage()]
    assert len(skips) == len(BAD_UPDATE_IDS)
    assert not [r for r in caplog.records if r.exc_info]  # no traceback


async def test_an_impossible_update_alone_is_logged_once_and_polled_calmly(setup, caplog):
    adapter, bot, model = setup
    caplog.set_level("WARNING", logger="gateway.surfaces.telegram.intake")
    bot.raw_update(_bad(2**63, "stuck?"))  # nothing after it: the offset cannot move past it
    await until(lambda: adapter.poller.skipped >= 1)
    calls = len(bot.calls_of("getUpdates"))
    await asyncio.sleep(1.0)
    assert len(bot.calls_of("getUpdates")) - calls <= 3  # waits between asks: no hot loop
    assert len([r for r in caplog.records if "skipped" in r.getMessage()]) == 1
    assert adapter.poller.skipped == 1  # the same update again is not counted again
    bot.message("after it")
    await until(lambda: model.turns == ["after it"])
    await until(lambda: not bot.updates)


# Fields no Bot API sends that a broken or hostile relay may: each update is skipped with
# one warning and no traceback, and the next good message is answered.
BAD_FIELDS: list[dict[str, Any]] = [
    {"message_thread_id": "general", "is_topic_message": True},
    {"message_thread_id": {"id": 5}, "is_topic_message": True},
    {"message_thread_id": 2**70, "is_topic_message": True},
    {"chat": {"id": {"nested": 1}, "type": "supergroup"}},
    {"chat": {"id": True, "type": "private"}},
    {"from": {"id": [42], "is_bot": False}},
]


@pytest.mark.parametrize("fields", BAD_FIELDS)
async def test_an_update_with_a_bad_field_is_skipped_with_one_warning(setup, caplog, fields):
    _, bot, model = setup
    caplog.set_level("WARNING")
    message = {
        "message_id": 1,
        "chat": {"id": -100123, "type": "supergroup"},
        "from": {"id": 42, "is_bot": False},
        "text": "bad field",
        **fields,
    }
    bot.raw_update({"update_id": 5000, "message": message})
    bot.message("good one")
    await until(lambda: model.turns == ["good one"])
    await until(lambda: not bot.updates)
    assert "bad field" not in model.turns
    warnings = [r for r in caplog.records if "skipped" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    assert not [r for r in caplog.records if r.exc_info]  # no traceback


async def test_an_update_stored_but_never_handed_out_is_answered_at_the_next_tick(setup):
    """The intake was cancelled between storing an update (claimed by this server) and
    handing it out, e.g. when the polling lease was lost mid-poll: the claim keeps anyone
    else off it, so this server hands it out itself, once."""
    adapter, bot, model = setup
    update = {
        "update_id": 5000,
        "message": {
            "message_id": 1,
            "date": 1,
            "text": "stranded",
            "chat": {"id": 42, "type": "private"},
            "from": {"id": 42, "is_bot": False, "first_name": "u"},
        },
    }
    await asyncio.to_thread(adapter.state.take_updates, adapter.bot, [update], move_offset=False)
    await until(lambda: bot.texts_to(42), timeout=15)
    await asyncio.sleep(2.5)  # another tick: not handed out again
    assert model.turns == ["stranded"]
    assert len(bot.texts_to(42)) == 1
    assert adapter.state.backend.unanswered(adapter.bot) == []
