"""One server's share of a chat bot's intake when several servers share the bot through the
store's durable inbox: the loop Telegram (``getUpdates`` polling) and Slack (Socket Mode)
both run, each with its own words in the log.

Every ``lease_seconds / 3``: renew this server's claims on the items (updates, events,
presses) it is answering, take over the items of a server that died (their claims lapsed)
and dispatch them, and, with a ``consumer`` (the poller, the socket), take or renew the
bot's consumer lease: the consumer runs only while it is held, so two servers never consume
at once for long; the others stand by and take over when the lease lapses. A consumer that
ends with one of ``final`` (a refused token) is said once and not started again, its lease
released for nobody; any other end is said and the consumer started again at the next tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Protocol

from agent.messages import JSONObject

__all__ = ["Consumer", "Dispatch", "IntakeState", "IntakeWords", "LeasedIntake"]

logger = logging.getLogger(__name__)

Dispatch = Callable[[int, JSONObject], None]


class IntakeState(Protocol):
    """The store's chat-platform state as the loop uses it."""

    @property
    def lease_seconds(self) -> float: ...

    def renew(self, bot: str) -> None: ...

    def claim_orphans(
        self, bot: str, in_hand: Collection[int] = ()
    ) -> list[tuple[int, JSONObject]]: ...

    def hold_poll_lease(self, bot: str) -> bool: ...

    def release_poll_lease(self, bot: str) -> None: ...


class Consumer(Protocol):
    """What takes the bot's items from its platform while this server holds the lease."""

    async def run(self) -> None: ...


@dataclass(frozen=True)
class IntakeWords:
    """What the log says, per platform: ``{bot}``, ``{item}`` and ``{error!r}`` are filled in."""

    platform: str  # "Telegram"
    item: str  # "update"
    consuming: str  # "polling for updates (bot {bot})"
    standing_by: str  # "another server polls bot {bot}; standing by to take over"
    ended: str  # "polling stopped ({error!r}); starting again"


class LeasedIntake:
    """See the module docstring; ``run()`` until cancelled. ``consuming`` says whether this
    server's consumer runs now."""

    def __init__(
        self,
        state: IntakeState,
        bot: str,
        dispatch: Dispatch,
        consumer: Consumer | None,
        words: IntakeWords,
        *,
        in_hand: Collection[int] = (),
        final: tuple[type[BaseException], ...] = (),
    ) -> None:
        self.state = state
        self.bot = bot
        self.dispatch = dispatch
        self.consumer = consumer
        self.words = words
        self.in_hand = in_hand  # the items this server is answering now (read, never changed)
        self.final = final
        self.consuming = False

    def _say(self, level: int, template: str, **values: object) -> None:
        logger.log(level, "%s: %s", self.words.platform, template.format(bot=self.bot, **values))

    async def run(self) -> None:
        task: asyncio.Task[None] | None = None
        standing_by = False
        try:
            while True:
                reached = True
                try:
                    await self._tick()
                    held = self.consumer is not None and await asyncio.to_thread(
                        self.state.hold_poll_lease, self.bot
                    )
                except Exception:
                    # The store is out of reach: consume no more (another server may take the
                    # lease meanwhile) and try again at the next tick.
                    logger.exception("%s: could not reach the shared state", self.words.platform)
                    held = reached = False
                if task is not None and task.done():
                    ended = None if task.cancelled() else task.exception()
                    task = None
                    if isinstance(ended, self.final):
                        # Wrong, not unlucky: said once; the lease goes to nobody.
                        self._say(logging.ERROR, "stopped for good: {error}", error=ended)
                        self.consumer = None
                        held = False
                        with contextlib.suppress(Exception):
                            await asyncio.to_thread(self.state.release_poll_lease, self.bot)
                    elif ended is not None:
                        self._say(logging.ERROR, self.words.ended, error=ended)
                if held and task is None and self.consumer is not None:
                    self._say(logging.INFO, self.words.consuming)
                    task = asyncio.create_task(
                        self.consumer.run(), name=f"{self.words.platform.lower()}-consumer"
                    )
                    standing_by = False
                elif not held and task is not None:
                    await _cancel(task)
                    task = None
                if self.consumer is not None and reached and not held and not standing_by:
                    standing_by = True
                    self._say(logging.INFO, self.words.standing_by)
                self.consuming = task is not None
                await asyncio.sleep(self.state.lease_seconds / 3)
        finally:
            if task is not None:
                await _cancel(task)
            self.consuming = False

    async def _tick(self) -> None:
        await asyncio.to_thread(self.state.renew, self.bot)
        in_hand = frozenset(self.in_hand)  # a copy: the thread must not see it change
        for item_id, item in await asyncio.to_thread(self.state.claim_orphans, self.bot, in_hand):
            self._say(
                logging.INFO,
                "{item} {item_id} taken over (its server is gone)",
                item=self.words.item,
                item_id=item_id,
            )
            self.dispatch(item_id, item)


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
