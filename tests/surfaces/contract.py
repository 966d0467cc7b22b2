"""What the surface contract suite needs from a chat platform's stand-in: ``FakePlatform``.

The suite (``test_contract.py``) runs every test against every platform in
``conftest.PLATFORMS``; a platform joins it with a ``FakePlatform`` over the fake server its
own tests already use (a real aiohttp server on loopback speaking the platform's wire
protocol) and one line in ``PLATFORMS``. Users are the platform's user ids as strings;
``OWNER`` and ``OTHER`` are both allowed to talk to the bot, each in a direct chat of their
own, and the owner's direct chat is where the suite's conversations happen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from gateway.session import SessionSource


@dataclass(frozen=True)
class Button:
    """An approval question the bot sent: where it is, and what its two buttons say."""

    message: Any
    approve: Any
    deny: Any


class FakePlatform(Protocol):
    """A running stand-in of one chat platform, driven by the contract suite."""

    name: str  # the ``Platform`` value
    owner: str
    other: str
    max_chars: int  # the platform's message limit, in its visible characters

    def env(self) -> dict[str, str]:
        """Environment that points ``reveille serve`` at the stand-in, OWNER and OTHER
        allowed."""
        ...

    def settings(self) -> dict[str, Any]:
        """The same as ``Settings`` keyword arguments (an in-process ``serve``)."""
        ...

    def source(self, user: str) -> SessionSource:
        """The direct chat of ``user`` with the bot, as the adapter names it."""
        ...

    def session_id(self, user: str) -> str:
        """The session the direct chat of ``user`` talks to first."""
        ...

    def say(self, text: str, *, user: str | None = None) -> None:
        """``user`` (the owner by default) writes ``text`` to the bot in their direct chat."""
        ...

    def replies(self, user: str | None = None) -> list[str]:
        """The visible texts of the bot's messages in the direct chat, as last edited."""
        ...

    def reply_times(self, user: str | None = None) -> list[float]:
        """When each of those messages was first sent (epoch seconds)."""
        ...

    def hold_replies(self) -> None:
        """New messages of the bot wait at the stand-in (they have not reached the chat)."""
        ...

    def release_replies(self, *, lost: bool) -> None:
        """Let waiting messages go on; ``lost``: they fail and never reach the chat (their
        sender was killed meanwhile)."""
        ...

    def held(self) -> int:
        """How many messages have waited at the stand-in."""
        ...

    def taken(self) -> bool:
        """Whether the bot has taken (received) a user's message yet."""
        ...

    def rate_limit(self, *, retry_after: float, when_text: str) -> None:
        """The next message whose text contains ``when_text`` is refused with the
        platform's rate-limit answer and ``retry_after`` seconds."""
        ...

    def rate_limited_at(self) -> list[float]:
        """When each rate-limit refusal was answered."""
        ...

    def block(self, user: str) -> None:
        """``user`` blocked the bot (or the chat is gone): whatever is sent there fails."""
        ...

    def buttons(self, user: str | None = None) -> list[Button]:
        """The approval questions in the direct chat that still have their buttons."""
        ...

    def press(self, button: Button, *, approve: bool, user: str | None = None) -> None:
        """``user`` (the owner by default) presses one of the buttons."""
        ...

    def press_answers(self) -> list[str]:
        """What the presser was told for each press, in order."""
        ...

    def stop(self) -> None: ...
