"""Telegram approvals in this process, over a real TurnService, the SQLite session store and
the fake Bot API: the inline keyboard, presses by the owner and by others, answered once,
a wake-up waiting behind the pending approval; and /new."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from delivery.session_backend import ApprovalRecord
from gateway.adapter import MessageEvent
from gateway.approvals import Approvals
from gateway.config import Platform
from gateway.session import SessionSource, SessionStore
from gateway.surfaces.telegram.adapter import TelegramAdapter, telegram_session_id
from gateway.surfaces.telegram.api import TelegramApi
from gateway.surfaces.telegram.state import TelegramState
from gateway.turns.service import TurnService
from tests.api_server.serve_support import wait_until
from tests.stores import session_file_store, telegram_backend
from tests.telegram.fake_bot_api import FakeBotApi


@dataclass
class _Result:
    content: str
    usage: Any = None


class AskingModel:
    """A turn whose message starts with "run " asks to run the rest; others just answer."""

    def __init__(self) -> None:
        self.turns: list[str] = []

    async def __call__(self, messages, ctx, on_delta):
        text = messages[-1]["content"]
        self.turns.append(text)
        if text.startswith("run "):
            ok = await ctx.confirm(text[4:])
            return _Result(f"**ran** `{text[4:]}`" if ok else "not run: denied")
        return _Result(f"answer to {text}")


@dataclass
class Chat:
    adapter: TelegramAdapter
    bot: FakeBotApi
    model: AskingModel
    store: SessionStore


@pytest.fixture
async def chat(tmp_path: Path) -> AsyncIterator[Chat]:
    bot = FakeBotApi().start()
    model = AskingModel()
    store = session_file_store(tmp_path / "sessions.db")
    approvals = Approvals(store, poll_seconds=0.1)
    turns = TurnService(
        store,
        model,
        render=lambda r: {"content": r.content},
        platform=Platform.TELEGRAM,
        session_key_of=lambda s: s,
        confirm_for=approvals.confirm_for,
        hold_sessions=True,
    )
    adapter = TelegramAdapter(
        api=TelegramApi(bot.token, base_url=bot.base_url),
        turns=turns,
        state=TelegramState(telegram_backend("sqlite", tmp_path)),
        allowed_users=frozenset({"42", "43"}),
        edit_interval=0.01,
        poll_timeout=1,
        approvals=approvals,
    )
    await adapter.start()
    try:
        yield Chat(adapter, bot, model, store)
    finally:
        await adapter.stop(grace_seconds=1)
        adapter.state.close()
        store.close()
        bot.stop()


async def until(check, timeout: float = 15.0) -> Any:
    return await asyncio.to_thread(wait_until, check, timeout)


SOURCE = SessionSource(platform=Platform.TELEGRAM, chat_id="42", user_id="42")


def buttons(sent) -> list[tuple[str, str]]:
    return [
        (b["text"], b["callback_data"]) for row in sent.reply_markup["inline_keyboard"] for b in row
    ]


async def test_a_command_is_asked_with_a_keyboard_and_gates_a_wake_up(chat: Chat) -> None:
    bot = chat.bot
    bot.message("run rm -rf ./build")
    [asked] = await until(lambda: bot.keyboards_to(42))
    (approve_text, approve), (deny_text, deny) = buttons(asked)
    assert (approve_text, deny_text) == ("Approve once", "Deny")
    # The buttons carry an opaque id, never the command.
    assert approve.startswith("appr:") and "rm" not in approve and "build" not in deny
    assert "rm -rf ./build" in asked.text and asked.parse_mode == "HTML"
    session_id = telegram_session_id(SOURCE)
    pending = chat.store.pending_approval(session_id)
    assert pending is not None and pending.command == "rm -rf ./build"

    # A wake-up for the chat waits behind the pending approval: its turn does not run.
    wake = asyncio.create_task(
        chat.adapter.handle_message(
            MessageEvent(
                text="[reveille:wake] finished",
                source=SOURCE,
                internal=True,
                session_id=session_id,
                metadata={"idempotency_key": "deleg_gated"},
            )
        )
    )
    # ... nor does a wake-up offered through another server (the store's lease says busy).
    other = TurnService(
        chat.store,
        chat.model,
        render=lambda r: {"content": r.content},
        platform=Platform.TELEGRAM,
        session_key_of=lambda s: s,
        hold_sessions=True,
    )
    from gateway.turns.service import TurnError, TurnRequest

    with pytest.raises(TurnError) as refused:
        await other.start(
            TurnRequest(
                session_id=session_id,
                messages=[{"role": "user", "content": "[reveille:wake] elsewhere"}],
                wakeup=True,
            )
        )
    assert refused.value.kind == "session_busy"
    assert not wake.done() and "[reveille:wake] finished" not in chat.model.turns

    # Someone else's press: not theirs. The owner's: decided once.
    bot.press(asked.message_id, approve, user_id=43, chat_id=42)
    bot.press(asked.message_id, "appr:appr_forged00000000:y", user_id=42)
    await until(lambda: len(bot.answers()) == 2)
    assert sorted(bot.answers()) == ["Not yours to decide.", "Unknown approval."]
    assert chat.store.get_approval(pending.id).status == "pending"
    bot.press(asked.message_id, approve, user_id=42)
    await until(lambda: len(bot.answers()) == 3)
    assert bot.answers()[-1] == "Approved."
    await asyncio.wait_for(wake, 15)
    assert chat.model.turns == ["run rm -rf ./build", "[reveille:wake] finished"]
    # The keyboard's message says what was decided, and has no buttons left.
    [decided] = [m for m in bot.messages_to(42) if m.message_id == asked.message_id]
    assert decided.reply_markup is None and "Approved once" in decided.text
    texts = bot.texts_to(42)
    assert "<b>ran</b> <code>rm -rf ./build</code>" in texts
    # A second press (a double tap, a stale keyboard): already decided.
    bot.press(asked.message_id, deny, user_id=42)
    await until(lambda: len(bot.answers()) == 4)
    assert bot.answers()[-1] == "Already decided: approved."
    assert chat.store.get_approval(pending.id).status == "approved"


async def test_deny_and_a_press_after_the_turn_is_gone(chat: Chat) -> None:
    bot = chat.bot
    bot.message("run make deploy")
    [asked] = await until(lambda: bot.keyboards_to(42))
    _, (_, deny) = buttons(asked)
    bot.press(asked.message_id, deny, user_id=42)
    await until(lambda: "not run: denied" in bot.texts_to(42))
    assert bot.answers() == ["Denied."]

    # An approval whose turn is gone (its server died: the lease lapsed) cannot be answered:
    # the press says so and the record is settled, never left pending.
    session_id = telegram_session_id(SOURCE)
    chat.store.take_turn(session_id, "turn_of_a_dead_server", ttl_seconds=0.3)
    stale = ApprovalRecord(
        "appr_stale000001", session_id, "turn_of_a_dead_server", "ls", "pending", time.time()
    )
    assert chat.store.ask_approval(stale)
    await until(lambda: not chat.store.running_turns())
    bot.press(asked.message_id, f"appr:{stale.id}:y", user_id=42)
    await until(lambda: len(bot.answers()) == 2)
    assert bot.answers()[-1].startswith("Expired")
    assert chat.store.get_approval(stale.id).status == "denied"


async def test_new_starts_a_fresh_session_and_keeps_the_old_one(chat: Chat) -> None:
    bot = chat.bot
    bot.message("hello")
    await until(lambda: "answer to hello" in bot.texts_to(42))
    first = telegram_session_id(SOURCE)
    bot.message("/new")
    await until(lambda: any("new conversation" in t for t in bot.texts_to(42)))
    bot.message("again")
    await until(lambda: "answer to again" in bot.texts_to(42))
    fresh = chat.adapter.state.chat_session(first)
    assert fresh is not None and fresh != first
    assert [m.content for m in chat.store.messages(first)] == ["hello", "answer to hello"]
    assert [m.content for m in chat.store.messages(fresh)] == ["again", "answer to again"]
    assert chat.model.turns == ["hello", "again"]  # /new itself ran no turn


async def test_html_that_telegram_cannot_parse_is_sent_as_plain_text(chat: Chat) -> None:
    bot = chat.bot
    bot.fail("sendMessage", 400, "Bad Request: can't parse entities: Unsupported start tag")
    bot.message("hi there")
    await until(lambda: "answer to hi there" in bot.texts_to(42))
    [plain] = [m for m in bot.messages_to(42) if m.text == "answer to hi there"]
    assert plain.parse_mode is None
