"""`reveille serve` with the Telegram adapter against the fake Bot API, end to end."""

from __future__ import annotations

import re
import time
from pathlib import Path

from delivery.rows import LedgerRow
from tests.api_server.serve_support import ledger_rows, wait_until
from tests.stores import session_file_store
from tests.telegram.conftest import serve
from tests.telegram.fake_bot_api import FakeBotApi


def _settled(home: Path) -> list[LedgerRow]:
    rows = ledger_rows(home)
    return [r for r in rows if r.delivery_state != "pending"]


def test_background_delegation_wakes_the_chat_exactly_once(tmp_path: Path, bot: FakeBotApi):
    server = serve(tmp_path, bot)
    try:
        bot.message("in the background: count the moons of Mars")
        wait_until(lambda: any("Started in the background" in t for t in bot.texts_to(42)))
        wait_until(lambda: _settled(tmp_path))
        time.sleep(1.0)  # nothing else arrives
        texts = bot.texts_to(42)
        print(texts)
        assert len(texts) == 2, texts
        assert "moons of Mars" in texts[1]
        [row] = ledger_rows(tmp_path)
        assert row.delivery_state == "delivered"
        assert row.delivery_attempts == 1
        assert ("42", "typing") in bot.actions
    finally:
        server.stop()


def test_background_shell_command_wakes_the_chat_with_its_output(tmp_path: Path, bot: FakeBotApi):
    server = serve(tmp_path, bot)
    try:
        bot.message("run in the background: echo hi-from-shell")
        wait_until(lambda: len(bot.texts_to(42)) >= 1)
        wait_until(lambda: _settled(tmp_path))
        time.sleep(1.0)
        texts = bot.texts_to(42)
        assert len(texts) == 2, texts
        assert "in the background" in texts[0]
        assert "hi-from-shell" in texts[1]
        assert [r.delivery_state for r in ledger_rows(tmp_path)] == ["delivered"]
    finally:
        server.stop()


def test_a_user_not_allowed_gets_no_turn_and_nothing_is_sent(tmp_path: Path, bot: FakeBotApi):
    server = serve(tmp_path, bot)
    try:
        bot.message("hello, who are you?", user_id=7)
        bot.message("hello", user_id=43)  # allowed: answered, so the first was processed
        wait_until(lambda: bot.texts_to(43))
        time.sleep(0.5)
        assert bot.messages_to(7) == []
        assert all(chat != "7" for chat, _ in bot.actions)
        assert [p for p in bot.calls_of("sendMessage") if str(p["chat_id"]) == "7"] == []
        server.wait_for(re.compile(r"ignoring a message from user 7"))
    finally:
        server.stop()

    with session_file_store(tmp_path / "sessions.db") as store:
        assert store.get_session("agent:main:telegram:dm:7") is None
        assert store.get_session("agent:main:telegram:dm:43") is not None


def test_nobody_allowed_means_the_bot_answers_nobody(tmp_path: Path, bot: FakeBotApi):
    server = serve(tmp_path, bot, TELEGRAM_ALLOWED_USERS="")
    try:
        server.wait_for(re.compile(r"no allowed users configured"))
        bot.message("hello")
        wait_until(lambda: bot.handed_out)
        time.sleep(0.5)
        assert bot.sent == []
    finally:
        server.stop()


def test_429_on_the_wake_up_is_waited_out_and_spends_no_attempt(tmp_path: Path, bot: FakeBotApi):
    server = serve(tmp_path, bot)
    try:
        # The reply to the message itself goes out; the wake-up's first send meets a 429.
        bot.fail(
            "sendMessage",
            429,
            "Too Many Requests: retry after 1",
            retry_after=1,
            when_text="Background",
        )
        bot.message("in the background: slow down")
        wait_until(lambda: _settled(tmp_path), timeout=30)
        texts = bot.texts_to(42)
        assert len(texts) == 2, texts
        assert "slow down" in texts[1]
        [row] = ledger_rows(tmp_path)
        assert row.delivery_state == "delivered"
        assert row.delivery_attempts == 1  # the 429's attempt was refunded
        [(_, code, refused_at)] = bot.failed
        assert code == 429
        wake = bot.messages_to(42)[1]
        assert wake.at - refused_at >= 1.0  # retry_after was honoured
        from tests.telegram.test_metrics import scrape, value

        samples = scrape(server.port)
        for outcome, count in (("retryable", 1), ("delivered", 1), ("released", 0)):
            got = value(samples, "reveille_deliveries_total", platform="telegram", outcome=outcome)
            assert got == count, outcome
        assert value(samples, "reveille_delivery_attempts_total", platform="telegram") == 2
    finally:
        server.stop()


def test_a_blocked_bot_drops_the_wake_up_and_keeps_the_result(tmp_path: Path, bot: FakeBotApi):
    server = serve(tmp_path, bot)
    try:
        bot.fail("sendMessage", 403, "Forbidden: bot was blocked by the user", when_text="Back")
        bot.message("in the background: unwanted")
        wait_until(lambda: _settled(tmp_path), timeout=30)
        [row] = ledger_rows(tmp_path)
        assert row.delivery_state == "dropped"
        assert row.settled_reason == "Telegram: Forbidden: bot was blocked by the user"
        assert row.state == "completed"
        assert "unwanted" in str(row.event)  # the result stays in the ledger
        assert len(bot.texts_to(42)) == 1
    finally:
        server.stop()


def test_409_from_get_updates_is_logged_and_retried(tmp_path: Path, bot: FakeBotApi):
    for _ in range(2):
        bot.fail("getUpdates", 409, "Conflict: terminated by other getUpdates request")
    server = serve(tmp_path, bot)
    try:
        bot.message("hello")
        wait_until(lambda: bot.texts_to(42), timeout=30)
        server.wait_for(re.compile(r"409 Conflict.*another process polls this bot token"))
        assert server.proc.poll() is None
    finally:
        server.stop()


def test_webhook_mode_answers_updates_posted_with_the_secret(tmp_path: Path, bot: FakeBotApi):
    import json
    import urllib.error
    import urllib.request

    server = serve(
        tmp_path,
        bot,
        TELEGRAM_WEBHOOK_URL="https://bot.example/telegram/hook",
        TELEGRAM_SECRET_TOKEN="hook-secret",
    )
    try:
        wait_until(lambda: bot.webhook is not None)
        assert bot.webhook["secret_token"] == "hook-secret"
        assert bot.webhook["url"] == "https://bot.example/telegram/hook"
        bot.message("via the webhook")
        update = bot.updates[0]

        def post(secret: str) -> int:
            request = urllib.request.Request(
                f"{server.url}/telegram/hook",
                data=json.dumps(update).encode(),
                method="POST",
                headers={
                    "Content-Type": "application/json",
                    "X-Telegram-Bot-Api-Secret-Token": secret,
                },
            )
            try:
                with urllib.request.urlopen(request, timeout=10) as resp:
                    return resp.status
            except urllib.error.HTTPError as exc:
                return exc.code

        assert post("wrong") == 401
        assert post("hook-secret") == 200
        assert post("hook-secret") == 200  # Telegram retrying: answered once
        wait_until(lambda: bot.texts_to(42))
        time.sleep(0.5)
        assert len(bot.texts_to(42)) == 1
        assert bot.calls_of("getUpdates") == []
    finally:
        server.stop()


def test_a_wake_up_waits_for_the_chats_running_turn_then_runs_once(tmp_path: Path, bot: FakeBotApi):
    server = serve(tmp_path, bot)
    try:
        bot.hold_sends.set()  # the turn that starts the work cannot finish its reply yet
        bot.message("in the background: wait your turn")
        wait_until(lambda: bot.held >= 1)
        time.sleep(1.5)  # the sub-agent is done long since; its wake-up waits for the chat
        [row] = ledger_rows(tmp_path)
        assert row.state == "completed"
        assert row.delivery_state == "pending"
        bot.hold_sends.clear()
        wait_until(lambda: _settled(tmp_path))
        time.sleep(0.5)
        texts = bot.texts_to(42)
        assert len(texts) == 2, texts
        assert texts[0].startswith("Started in the background")
        assert "wait your turn" in texts[1] and "finished" in texts[1]
        [row] = ledger_rows(tmp_path)
        assert row.delivery_state == "delivered"
        assert row.delivery_attempts == 1
    finally:
        server.stop()


def test_start_and_help_are_answered_by_the_bot_without_a_turn(tmp_path: Path, bot: FakeBotApi):
    server = serve(tmp_path, bot)
    try:
        bot.message("/start")
        bot.message("/help@reveille_bot")
        wait_until(lambda: len(bot.texts_to(42)) >= 2)
        texts = bot.texts_to(42)
        assert all("background" in t and "/help" in t for t in texts)
        bot.message("hello")  # an ordinary message after them is a turn as always
        wait_until(lambda: len(bot.texts_to(42)) >= 3)
    finally:
        server.stop()
    with session_file_store(tmp_path / "sessions.db") as store:
        rows = store.messages("agent:main:telegram:dm:42")
    assert [m.content for m in rows if m.role == "user"] == ["hello"]  # no turn for commands
