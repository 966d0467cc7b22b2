"""`/timers` on Telegram (a real `reveille serve` against the fake Bot API): the chat's
schedules and pending reminders, each with its id, next due time and note; and a schedule
made on Telegram fires into the chat as pushed messages restating its note."""

from __future__ import annotations

from pathlib import Path

from tests.api_server.serve_support import wait_until
from tests.telegram.conftest import serve
from tests.telegram.fake_bot_api import FakeBotApi

FAST = {"REVEILLE_TIMERS_MIN_DELAY_SECONDS": "1"}


def test_timers_lists_what_is_scheduled_and_a_schedule_pushes_its_occurrences(
    tmp_path: Path, bot: FakeBotApi
) -> None:
    server = serve(tmp_path, bot, **FAST)
    try:
        bot.message("/timers")
        wait_until(lambda: any("Nothing is scheduled" in t for t in bot.texts_to(42)), timeout=30)
        bot.message("remind me in 600 seconds: water the plants")
        wait_until(lambda: any("Reminder set for" in t for t in bot.texts_to(42)), timeout=30)
        bot.message("every 2 seconds: drink water")
        wait_until(lambda: any("set: every 2 seconds" in t for t in bot.texts_to(42)), timeout=30)
        bot.message("/timers")
        wait_until(lambda: any("Scheduled here:" in t for t in bot.texts_to(42)), timeout=30)
        [listing] = [t for t in bot.texts_to(42) if "Scheduled here:" in t]
        assert "drink water — every 2 s, next" in listing and "sch_" in listing
        assert "water the plants — once" in listing and "tmr_" in listing
        # Occurrences come home as pushed messages restating the note.
        wait_until(
            lambda: sum("Reminder: drink water" in t for t in bot.texts_to(42)) >= 2, timeout=40
        )
    finally:
        server.stop()
