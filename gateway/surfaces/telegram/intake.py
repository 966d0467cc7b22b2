"""How updates reach the Telegram adapter: long polling (default) or a webhook.

Polling: ``getUpdates`` with ``offset`` (from the durable state) and ``timeout``; what it
returns is stored in the inbox and the offset moved in one transaction
(``TelegramState.take_updates``), then handed to the adapter. A failure is logged and retried
with a growing backoff, never a crash loop; a 409 (another poller on the same token, or a
webhook set) is logged once, plainly as what it is, and its repeats at DEBUG until a poll
succeeds again (two servers on one token otherwise log an ERROR every few seconds).

Several servers on one store (``SharedIntake``, the loop of ``gateway.surfaces.leased_intake``
that Slack shares): only the holder of the polling lease runs the ``getUpdates`` loop, the
others stand by and take over when the lease lapses or its holder is proved dead; every
server keeps its claims on the updates it answers alive and takes over the updates of a
server that died (its claims lapsed), webhook mode included.

Webhook: Telegram POSTs each update to ``webhook_url`` with the ``secret_token`` given to
``setWebhook`` in ``X-Telegram-Bot-Api-Secret-Token``; the handler compares it in constant
time on every request (401 otherwise), stores the update in the inbox and only then answers
200, so an update Telegram saw accepted is durable.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from aiohttp import web

from gateway.surfaces.leased_intake import Dispatch, IntakeWords, LeasedIntake
from gateway.surfaces.telegram.api import TelegramApi, TelegramError
from gateway.surfaces.telegram.state import TelegramState
from gateway.surfaces.telegram.updates import (
    SkippedUpdates,
    TooDeep,
    loads_bounded,
    split_updates,
    update_id_of,
)

__all__ = ["SECRET_HEADER", "LongPoller", "SharedIntake", "webhook_handler"]

logger = logging.getLogger(__name__)

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
_MAX_BACKOFF_SECONDS = 60.0
# A batch of nothing but skipped updates cannot move the offset, so the server sends it
# again at once: ask again after a pause, short enough not to hold up a later good update.
_SKIPPED_ONLY_MAX_WAIT_SECONDS = 5.0
_ALLOWED_UPDATES = ["message", "callback_query"]


class LongPoller:
    """The ``getUpdates`` loop of one bot; ``run()`` until cancelled."""

    def __init__(
        self,
        api: TelegramApi,
        state: TelegramState,
        dispatch: Dispatch,
        *,
        timeout: int = 25,
        backoff_seconds: float = 1.0,
    ) -> None:
        self.api = api
        self.state = state
        self.dispatch = dispatch
        self.timeout = timeout
        self.backoff_seconds = backoff_seconds
        self.conflicts = 0
        self.failures = 0
        self.skipped_updates = SkippedUpdates("getUpdates")

    @property
    def skipped(self) -> int:
        """Distinct updates skipped for an impossible ``update_id``."""
        return self.skipped_updates.count

    async def run(self) -> None:
        bot = self.api.bot_id
        backoff = self.backoff_seconds
        offset = await asyncio.to_thread(self.state.next_offset, bot)
        skipped_wait = self.backoff_seconds
        in_conflict = False  # a 409 was reported and no poll has succeeded since
        while True:
            try:
                updates = await self._get_updates(offset)
            except asyncio.CancelledError:
                raise
            except TelegramError as exc:
                self.failures += 1
                if exc.error_code == 409:
                    self.conflicts += 1
                    # Once per episode: the cause does not change while it lasts.
                    level = logging.DEBUG if in_conflict else logging.ERROR
                    in_conflict = True
                    logger.log(
                        level,
                        "Telegram getUpdates: 409 Conflict (%s): another process polls this "
                        "bot token, or a webhook is set. Retrying in %.0f s; stop the other "
                        "poller (or unset its webhook) to fix it.",
                        exc.description,
                        backoff,
                    )
                elif exc.error_code == 401:
                    logger.error(
                        "Telegram getUpdates: 401 Unauthorized: TELEGRAM_BOT_TOKEN is not "
                        "valid; retrying in %.0f s",
                        backoff,
                    )
                else:
                    logger.warning(
                        "Telegram getUpdates failed (%s); retrying in %.0f s", exc, backoff
                    )
                await asyncio.sleep(exc.retry_after if exc.retry_after else backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF_SECONDS)
                continue
            backoff = self.backoff_seconds
            in_conflict = False
            if not isinstance(updates, list) or not updates:
                continue
            good = split_updates(updates, self.skipped_updates)
            if not good:
                await asyncio.sleep(skipped_wait)
                skipped_wait = min(skipped_wait * 2, _SKIPPED_ONLY_MAX_WAIT_SECONDS)
                continue
            skipped_wait = self.backoff_seconds
            try:
                fresh = await asyncio.to_thread(self.state.take_updates, bot, [u for _, u in good])
            except Exception:
                # Not taken: the offset did not move, so the same updates come again.
                self.failures += 1
                logger.exception("Telegram: could not store updates; retrying in %.0f s", backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF_SECONDS)
                continue
            offset = max(update_id for update_id, _ in good) + 1
            for update_id, update in fresh:
                self.dispatch(update_id, update)

    async def _get_updates(self, offset: int | None) -> Any:
        return await self.api.call(
            "getUpdates",
            {"offset": offset, "timeout": self.timeout, "allowed_updates": _ALLOWED_UPDATES},
            # The request outlives the long poll it asks for.
            http_timeout=self.timeout + 15.0,
        )


_WORDS = IntakeWords(
    platform="Telegram",
    item="update",
    consuming="polling for updates (bot {bot})",
    standing_by="another server polls bot {bot}; standing by to take over",
    ended="polling stopped ({error!r}); starting again",
)


class SharedIntake(LeasedIntake):
    """This server's share of the intake of one bot (``gateway.surfaces.leased_intake``):
    with a ``poller``, it polls only while holding the polling lease."""

    def __init__(
        self,
        state: TelegramState,
        bot: str,
        dispatch: Dispatch,
        poller: LongPoller | None = None,
        *,
        in_hand: Collection[int] = (),
    ) -> None:
        super().__init__(state, bot, dispatch, poller, _WORDS, in_hand=in_hand)

    @property
    def polling(self) -> bool:
        return self.consuming


def webhook_handler(
    state: TelegramState,
    bot: str,
    secret_token: str,
    dispatch: Dispatch,
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The aiohttp handler Telegram POSTs updates to."""
    if not secret_token:
        raise ValueError("webhook mode needs a secret_token")
    expected = secret_token.encode("utf-8")
    skipped = SkippedUpdates("webhook")

    async def handle(request: web.Request) -> web.Response:
        # Compared as the bytes that came (a header that is not UTF-8 decodes with surrogate
        # escapes); none, or several, is no secret. A malformed header is a 401, never a 500.
        sent = request.headers.getall(SECRET_HEADER, [])
        given = sent[0].encode("utf-8", "surrogateescape") if len(sent) == 1 else b""
        if not hmac.compare_digest(given, expected):
            return web.json_response({"ok": False, "description": "unauthorized"}, status=401)
        raw = await request.read()
        try:
            update = loads_bounded(raw)
        except TooDeep:
            # Skipped like an impossible id (below): Telegram never sends one, and a refused
            # update would hold every later one back.
            skipped.record(raw)
            return web.json_response({"ok": True, "description": "skipped"})
        except ValueError:
            return web.json_response({"ok": False, "description": "not JSON"}, status=400)
        if update_id_of(update) is None:
            # Answered 200: Telegram resends a refused update and holds every later one
            # back behind it, so an update we can never take is skipped (and recorded).
            skipped.record(update)
            return web.json_response({"ok": True, "description": "skipped"})
        fresh = await asyncio.to_thread(state.take_updates, bot, [update], move_offset=False)
        for update_id, payload in fresh:
            dispatch(update_id, payload)
        return web.json_response({"ok": True})

    return handle
