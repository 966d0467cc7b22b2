"""`/stop` on Telegram (a real `reveille serve` against the fake Bot API): it cancels the
chat's running background command, says what it stopped, and the chat gets one notice that
says who stopped it, never the command's result."""

from __future__ import annotations

from pathlib import Path

from tests.api_server.serve_support import ledger_rows, wait_until
from tests.telegram.conftest import serve
from tests.telegram.fake_bot_api import FakeBotApi

NEVER_ASK = {"REVEILLE_SHELL_APPROVALS": "never"}


def test_stop_cancels_the_chats_background_work(tmp_path: Path, bot: FakeBotApi) -> None:
    server = serve(tmp_path, bot, **NEVER_ASK)
    try:
        bot.message("/stop")
        wait_until(lambda: any("Nothing is running" in t for t in bot.texts_to(42)), timeout=30)
        bot.message("run in the background: sleep 300; echo never-printed")
        wait_until(
            lambda: any("Started <code>sleep 300" in t for t in bot.texts_to(42)), timeout=30
        )
        bot.message("/stop")
        wait_until(
            lambda: any("Stopped 1 background task" in t for t in bot.texts_to(42)), timeout=30
        )
        assert any("sleep 300; echo never-printed" in t for t in bot.texts_to(42))

        def row():
            rows = [r for r in ledger_rows(tmp_path) if "never-printed" in (r.goal or "")]
            return rows[0] if rows else None

        wait_until(lambda: row() and row().delivery_state == "delivered", timeout=60)
        assert row().state == "cancelled" and "on Telegram" in row().event["cancelled_by"]
        # One wake-up, whose answer says who stopped it; the command's own end is never told.
        told = [t for t in bot.texts_to(42) if "Stopped by" in t and "on Telegram" in t]
        assert len(told) == 1
        assert not any("exit code 0" in t or "exit code 143" in t for t in bot.texts_to(42))
    finally:
        server.stop()
