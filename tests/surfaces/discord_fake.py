"""Discord in the contract suite: ``FakePlatform`` over the Discord tests' stand-in
(``tests/discord/fake_discord.py``, on a loop of its own thread). Each user's direct chat
with the bot is a DM channel of its own.

The suite itself (``contract.py``, ``conftest.py``, ``test_contract.py``) comes with the
surface port's branch; Discord joins it with ``"discord": DiscordPlatform`` in
``conftest.PLATFORMS``."""

from __future__ import annotations

from typing import Any

from gateway.config import Platform
from gateway.session import SessionSource
from gateway.surfaces.discord.intake import discord_session_id
from tests.discord.fake_discord import Sent, ThreadedFakeDiscord
from tests.surfaces.contract import Button


def dm_channel(user: str) -> str:
    """The DM channel of ``user`` with the bot (the stand-in's numbering)."""
    return str(700_000_000_000_000_000 + int(user))


class DiscordPlatform:
    name = Platform.DISCORD.value
    owner = "42"
    other = "43"
    max_chars = 2000

    def __init__(self) -> None:
        self.threaded = ThreadedFakeDiscord()
        self.fake = self.threaded.fake

    def env(self) -> dict[str, str]:
        return {
            "DISCORD_BOT_TOKEN": self.fake.token,
            "DISCORD_API_BASE": self.fake.api_base,
            "DISCORD_ALLOWED_USERS": f"{self.owner},{self.other}",
        }

    def settings(self) -> dict[str, Any]:
        return {
            "discord_bot_token": self.fake.token,
            "discord_api_base": self.fake.api_base,
            "discord_allowed_users": f"{self.owner},{self.other}",
        }

    def source(self, user: str) -> SessionSource:
        return SessionSource(
            platform=Platform.DISCORD, chat_id=dm_channel(user), chat_type="dm", user_id=user
        )

    def session_id(self, user: str) -> str:
        return discord_session_id(self.source(user))

    def say(self, text: str, *, user: str | None = None) -> None:
        author = user or self.owner
        self.fake_wait_connected()
        self.threaded.call(
            lambda: self.fake.message(text, author=author, channel_id=dm_channel(author))
        )

    def fake_wait_connected(self) -> None:
        """A message pushed before the bot is connected would reach nobody (as on Discord)."""
        self.threaded.call(lambda: self.fake.wait_connected(timeout=30))

    def _sent(self, user: str | None) -> list[Sent]:
        return self.fake.messages_to(dm_channel(user or self.owner))

    def replies(self, user: str | None = None) -> list[str]:
        return [s.content for s in self._sent(user)]

    def reply_times(self, user: str | None = None) -> list[float]:
        return [s.at for s in self._sent(user)]

    def hold_replies(self) -> None:
        self.fake.holding = True

    def release_replies(self, *, lost: bool) -> None:
        self.fake.discard_held = lost
        self.fake.holding = False

    def held(self) -> int:
        return self.fake.held

    def taken(self) -> bool:
        return self.fake.held > 0 or bool(self.fake.typing)

    def rate_limit(self, *, retry_after: float, when_text: str) -> None:
        self.fake.rate_limit_text(when_text, retry_after)

    def rate_limited_at(self) -> list[float]:
        return list(self.fake.rate_limited)

    def block(self, user: str) -> None:
        self.fake.blocked.add(dm_channel(user))

    def buttons(self, user: str | None = None) -> list[Button]:
        found = []
        for sent in self._sent(user):
            ids = dict(self.fake.buttons(sent))
            if ids:
                found.append(Button(sent.id, ids["Approve once"], ids["Deny"]))
        return found

    def press(self, button: Button, *, approve: bool, user: str | None = None) -> None:
        [sent] = [s for s in self.fake.sent if s.id == button.message]
        custom_id = button.approve if approve else button.deny
        by = user or self.owner
        self.threaded.call(lambda: self.fake.press(sent, custom_id, by=by))

    def press_answers(self) -> list[str]:
        return [str(c.data.get("content") or "") for c in self.fake.callbacks]

    def stop(self) -> None:
        self.fake.holding = False
        self.threaded.stop()
