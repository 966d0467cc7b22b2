"""`reveille serve` SIGKILLed mid-answer, restarted on the same state: no update lost or
answered twice, and a wake-up repeated at most once."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

from tests.api_server.serve_support import call, ledger_rows, wait_until
from tests.telegram.conftest import serve
from tests.telegram.fake_bot_api import FakeBotApi

SESSION = "agent:main:telegram:dm:42"


def _user_turns(port: int) -> list[str]:
    status, _, data = call(port, "GET", f"/api/sessions/{SESSION}/messages")
    assert status == 200, data
    return [m["content"] for m in data["data"] if m["role"] == "user"]


def test_killed_after_an_update_was_handed_out_it_is_answered_once(tmp_path: Path, bot: FakeBotApi):
    bot.hold_sends.set()  # the reply cannot reach the chat before the kill
    first = serve(tmp_path, bot)
    bot.message("hello there")
    wait_until(lambda: bot.held >= 1)
    assert bot.handed_out
    first.stop(signal.SIGKILL)
    bot.discard_held = True
    bot.hold_sends.clear()
    time.sleep(0.2)
    assert bot.sent == []

    bot.discard_held = False
    second = serve(tmp_path, bot)
    try:
        wait_until(lambda: bot.texts_to(42))
        time.sleep(1.0)
        assert len(bot.texts_to(42)) == 1
        # One turn: the restart answered from the stored turn instead of running it again.
        assert _user_turns(second.port) == ["hello there"]
        # The update is confirmed: a third start does not answer it again.
    finally:
        second.stop()
    third = serve(tmp_path, bot)
    try:
        time.sleep(1.5)
        assert len(bot.texts_to(42)) == 1
    finally:
        third.stop()


def test_killed_before_the_turn_ran_the_update_is_taken_again(tmp_path: Path, bot: FakeBotApi):
    first = serve(tmp_path, bot)
    first.stop(signal.SIGKILL)  # never polled, or polled and died: nothing confirmed
    bot.message("are you there?")
    second = serve(tmp_path, bot)
    try:
        wait_until(lambda: bot.texts_to(42))
        time.sleep(1.0)
        assert len(bot.texts_to(42)) == 1
        assert _user_turns(second.port) == ["are you there?"]
    finally:
        second.stop()


def test_killed_after_the_wake_up_was_sent_before_its_ack_repeats_at_most_once(
    tmp_path: Path, bot: FakeBotApi
):
    first = serve(tmp_path, bot, hold_ack=True)
    bot.message("in the background: survive a crash")
    first.wait_for(re.compile(r"HOLDING-ACK deleg_"))
    wait_until(lambda: len(bot.texts_to(42)) >= 2)
    first.stop(signal.SIGKILL)
    assert ledger_rows(tmp_path)[0].delivery_state == "pending"

    second = serve(tmp_path, bot)
    try:
        wait_until(lambda: ledger_rows(tmp_path)[0].delivery_state == "delivered", timeout=30)
        time.sleep(0.5)
        wakes = [t for t in bot.texts_to(42) if "survive a crash" in t and "finished" in t]
        assert 1 <= len(wakes) <= 2  # at most one repeat (README); here none at all
        assert len(wakes) == 1
        # The wake-up's turn ran once (the re-offer replayed it).
        assert sum("[reveille:wake]" in t for t in _user_turns(second.port)) == 1
    finally:
        second.stop()
