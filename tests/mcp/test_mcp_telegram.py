"""`reveille serve` with an MCP server in its settings file and Telegram (the fake Bot API):
a call that needs approval is asked with the chat's keyboard, and runs once approved."""

from __future__ import annotations

import json
from pathlib import Path

from tests.api_server.serve_support import wait_until
from tests.telegram.conftest import bot, serve
from tests.telegram.fake_bot_api import FakeBotApi
from tests.telegram.test_serve_approvals import data, keyboard

from ._support import stdio_echo

__all__ = ["bot"]  # the fixture, used by name


def test_an_mcp_call_is_approved_on_telegram(tmp_path: Path, bot: FakeBotApi) -> None:
    command = ", ".join(json.dumps(part) for part in stdio_echo().command)
    (tmp_path / "config.toml").write_text(f"[mcp.servers.echo]\ncommand = [{command}]\n")
    server = serve(tmp_path, bot)
    try:
        bot.message('call echo__note with {"text": "from telegram"}')
        asked = keyboard(bot, set())
        assert "echo__note" in asked.text
        bot.press(asked.message_id, data(asked, "Approve once"))
        wait_until(lambda: any("noted: from telegram" in t for t in bot.texts_to(42)), timeout=30)
        # A read-only tool runs without asking.
        bot.message('call echo__say with {"text": "no keyboard"}')
        wait_until(lambda: any("echo: no keyboard" in t for t in bot.texts_to(42)), timeout=30)
        assert bot.keyboards_to(42) == []  # the first one was answered; none asked since
    finally:
        server.stop()
