"""Telegram in the contract suite: ``FakePlatform`` over the Telegram tests' fake Bot API."""

from __future__ import annotations

from typing import Any

from gateway.config import Platform
from gateway.session import SessionSource
from gateway.surfaces.telegram.adapter import telegram_session_id
from tests.surfaces.contract import Button
from tests.telegram.fake_bot_api import FakeBotApi, Sent, parse_html


def _visible(sent: Sent) -> str:
    return parse_html(sent.text) if sent.parse_mode == "HTML" else sent.text


def _data(sent: Sent, label: str) -> str:
    rows = sent.reply_markup["inline_keyboard"] if sent.reply_markup else []
    return next(b["callback_data"] for row in rows for b in row if b["text"] == label)


class TelegramPlatform:
    name = Platform.TELEGRAM.value
    owner = "42"
    other = "43"
    max_chars = 4096

    def __init__(self) -> None:
        self.bot = FakeBotApi().start()

    def env(self) -> dict[str, str]:
        return {
            "TELEGRAM_BOT_TOKEN": self.bot.token,
            "TELEGRAM_BASE_URL": self.bot.base_url,
            "TELEGRAM_ALLOWED_USERS": f"{self.owner},{self.other}",
            "TELEGRAM_EDIT_INTERVAL": "0.05",
        }

    def settings(self) -> dict[str, Any]:
        return {
            "telegram_bot_token": self.bot.token,
            "telegram_base_url": self.bot.base_url,
            "telegram_allowed_users": f"{self.owner},{self.other}",
            "telegram_edit_interval": 0.01,
        }

    def source(self, user: str) -> SessionSource:
        return SessionSource(platform=Platform.TELEGRAM, chat_id=user, chat_type="dm", user_id=user)

    def session_id(self, user: str) -> str:
        return telegram_session_id(self.source(user))

    def say(self, text: str, *, user: str | None = None) -> None:
        self.bot.message(text, user_id=int(user or self.owner))

    def replies(self, user: str | None = None) -> list[str]:
        return [_visible(s) for s in self.bot.messages_to(user or self.owner)]

    def reply_times(self, user: str | None = None) -> list[float]:
        return [s.at for s in self.bot.messages_to(user or self.owner)]

    def hold_replies(self) -> None:
        self.bot.hold_sends.set()

    def release_replies(self, *, lost: bool) -> None:
        self.bot.discard_held = lost
        self.bot.hold_sends.clear()

    def held(self) -> int:
        return self.bot.held

    def taken(self) -> bool:
        return bool(self.bot.handed_out)

    def rate_limit(self, *, retry_after: float, when_text: str) -> None:
        self.bot.fail(
            "sendMessage",
            429,
            f"Too Many Requests: retry after {retry_after:g}",
            retry_after=retry_after,
            when_text=when_text,
        )

    def rate_limited_at(self) -> list[float]:
        return [at for _, code, at in self.bot.failed if code == 429]

    def block(self, user: str) -> None:
        self.bot.blocked.add(user)

    def buttons(self, user: str | None = None) -> list[Button]:
        return [
            Button(s.message_id, _data(s, "Approve once"), _data(s, "Deny"))
            for s in self.bot.keyboards_to(user or self.owner)
        ]

    def press(self, button: Button, *, approve: bool, user: str | None = None) -> None:
        data = button.approve if approve else button.deny
        self.bot.press(
            button.message, data, user_id=int(user or self.owner), chat_id=int(self.owner)
        )

    def press_answers(self) -> list[str]:
        return self.bot.answers()

    def stop(self) -> None:
        self.bot.hold_sends.clear()
        self.bot.stop()
