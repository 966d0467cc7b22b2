"""`reveille serve` with the Telegram adapter against the fake Bot API, end to end."""

from __future__ import annotations

import time
from pathlib import Path

from tests.api_server.serve_support import ledger_rows, wait_until
from tests.telegram.conftest import serve
from tests.telegram.fake_bot_api import FakeBotApi


def _settled(home: Path) -> list[dict]:
    rows = ledger_rows(home)
    return [r for r in rows if r["delivery_state"] != "pending"]


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
        assert row["delivery_state"] == "delivered"
        assert row["delivery_attempts"] == 1
        assert ("42", "typing") in bot.actions
    finally:
        server.stop()
