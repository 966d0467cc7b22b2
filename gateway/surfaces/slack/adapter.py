"""The Slack adapter: a chat surface (``gateway.surfaces.port.ChatSurface``) over the Web API
(slack-sdk's ``AsyncWebClient``), taking events by Socket Mode, the HTTP Events API, or both.

Started by ``reveille serve`` when ``SLACK_BOT_TOKEN`` is set.

* Where Slack is: ``base_url`` (``SLACK_BASE_URL``, by default ``https://slack.com/api/``),
  the Web API root of every call, ``apps.connections.open`` included.
* Start: a bot token Slack refuses (``auth.test``: ``invalid_auth``, ``token_revoked``...),
  or an app-level token it refuses (``apps.connections.open``), stops the start
  (``SlackTokenRefused``, one line); Slack unreachable does not (the calls after it are
  retried as they come; Socket Mode's connecting with a capped exponential back-off).
* Intake: Socket Mode (``socket``, with the app-level token) and/or the Events API (``http``,
  with the signing secret). Either way an event is stored in the durable inbox of the
  store's chat-platform state by its ``event_id`` (``SlackRecords.take_updates``) before
  Slack is told it arrived, and only a fresh one is answered: a re-sent event
  (``X-Slack-Retry-Num``, a Socket Mode redelivery), whichever server it reaches, is
  answered once. Each server keeps its claims on the events it answers alive and takes over
  the ones of a server that died (``claim_orphans``), its own after a SIGKILL included.
  Socket Mode runs on the one server holding the bot's lease (renewed every third of
  the state's lease; a dead holder's is taken over): ``gateway.surfaces.leased_intake``,
  the loop Telegram's polling shares.
* Messages (``intake``) from users in ``allowed_users`` are answered through
  ``ChatTurns.answer_message``, keyed by the message's channel and ``ts`` (a message and its
  ``app_mention`` are one), in the channel, or in the thread the message came from; anyone
  else's gets nothing (counted and logged). With nobody allowed the bot answers nobody.
* Replies are mrkdwn (``format``): ``split`` returns the pieces already as mrkdwn, which
  ``send_text`` sends as they are (``chat.postMessage``, ``chat.update`` for an edit; the
  port's integer message id is the message's ``ts`` without its dot).
* Approvals are Block Kit buttons (``approvals``): a press (Socket Mode ``interactive`` or
  ``/slack/interactivity``) is stored in the inbox by its stable id (``press_key``) before
  Slack is told it arrived, and decided from there like an event: once, on whichever server
  holds its claim (a SIGKILLed server's presses are taken over). Only the conversation's
  owner decides (``decide_press``); the presser is told the answer ephemerally, and a
  decided question is replaced by its verdict.
* Commands: one slash command (``/reveille``, registered in the app's settings; its
  Request URL ``/slack/commands`` when using the Events API) with a word: ``new`` maps the
  chat to a fresh session (the old one kept, its late results still come home to it),
  ``timers`` lists the chat's reminders and schedules, anything else (``help``) says what
  the bot does. Answered by the bot itself, no turn, to the user who typed it only (in the
  Socket Mode acknowledgement or the HTTP response); only ``allowed_users`` may.
* Wake-ups: ``handle_message`` with an internal event goes to ``ChatTurns.wake``.
* Errors (``surface_error``): HTTP 429 (``ratelimited``) is ``RATE_LIMITED`` with its
  ``Retry-After``, honoured above the port; ``channel_not_found``, ``not_in_channel``,
  ``is_archived``, ``account_inactive`` and the like are ``GONE``; 5xx and connection
  failures ``TRANSIENT``; any other refusal ``REFUSED``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
from collections.abc import Collection, Coroutine
from typing import Any, Protocol

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from agent.messages import JSONObject, JSONValue
from gateway.adapter import BasePlatformAdapter, MessageEvent
from gateway.approvals import ApprovalRecord, Approvals
from gateway.config import Platform
from gateway.session import SessionSource, is_valid_session_id
from gateway.surfaces.approval_press import decide_press
from gateway.surfaces.chat import ChatTurns
from gateway.surfaces.leased_intake import IntakeWords, LeasedIntake
from gateway.surfaces.port import Refusal, ReplyRecords, SplitSend, SurfaceError, SurfaceLimits
from gateway.surfaces.slack.approvals import question_blocks, question_text
from gateway.surfaces.slack.format import MAX_MESSAGE_LENGTH, split_message, to_mrkdwn
from gateway.surfaces.slack.http import (
    Handler,
    commands_handler,
    events_handler,
    interactivity_handler,
)
from gateway.surfaces.slack.intake import (
    command_of,
    inbox_id,
    message_of,
    press_key,
    press_of,
    slack_session_id,
)
from gateway.surfaces.slack.socket import SocketMode
from gateway.surfaces.slack.tokens import REFUSED_TOKEN_ERRORS, SlackTokenRefused
from gateway.surfaces.timers import timers_text
from gateway.tasks import finish_or_cancel
from gateway.turns.service import TurnService

__all__ = [
    "DEFAULT_BASE_URL",
    "HELP_TEXT",
    "SlackAdapter",
    "SlackRecords",
    "SlackTokenRefused",
    "surface_error",
]

logger = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://slack.com/api/"
# Slack's errors for a chat the bot can no longer write to.
_GONE_ERRORS = frozenset(
    {
        "channel_not_found",
        "not_in_channel",
        "is_archived",
        "account_inactive",
        "user_disabled",
        "user_not_found",
        "cannot_dm_bot",
        "restricted_action",
    }
)
_WORDS = IntakeWords(
    platform="Slack",
    item="event",
    consuming="holding the Socket Mode lease ({bot})",
    standing_by="another server holds the Socket Mode lease; standing by to take over",
    ended="Socket Mode ended ({error!r})",
)
HELP_TEXT = (
    "I am Reveille: an agent whose background work comes home.\n\n"
    "Write to me as you would to anyone. Ask for something long 'in the background' and "
    "go on talking: when the work is done, its result comes back here as a new message.\n\n"
    "`/reveille new` starts a fresh conversation (the old one is kept).\n"
    "`/reveille timers` lists the reminders and schedules of this chat.\n"
    "`/reveille help` shows this again."
)
_CALL_ERRORS = (SlackApiError, aiohttp.ClientError, OSError, TimeoutError)


class SlackRecords(ReplyRecords, Protocol):
    """The store's chat-platform state as the Slack adapter uses it: the inbox (by inbox
    id), its claims and the one consumer lease of the bot, the reply records and the
    chat-to-session map (``gateway.surfaces.telegram.state.TelegramState``'s face)."""

    lease_seconds: float

    def take_updates(
        self, bot: str, updates: list[JSONObject], *, move_offset: bool = True
    ) -> list[tuple[int, JSONObject]]: ...

    def claim_orphans(
        self, bot: str, in_hand: Collection[int] = ()
    ) -> list[tuple[int, JSONObject]]: ...

    def renew(self, bot: str) -> None: ...

    def mark_answered(self, bot: str, update_id: int) -> None: ...

    def hold_poll_lease(self, bot: str) -> bool: ...

    def release_poll_lease(self, bot: str) -> None: ...

    def chat_session(self, chat_key: str) -> str | None: ...

    def start_chat_session(self, chat_key: str, session_id: str) -> None: ...

    def prune(self, keep_seconds: float = ...) -> None: ...


def surface_error(exc: Exception) -> SurfaceError:
    """A failed Web API call as the port classifies it (see the module docstring)."""
    if isinstance(exc, SlackApiError):
        response = exc.response
        status = int(response.status_code)
        error = str(response.get("error") or f"HTTP {status}")
        if status == 429 or error == "ratelimited":
            try:
                retry = float(response.headers.get("Retry-After") or 1.0)
            except ValueError:
                retry = 1.0
            return SurfaceError(error, kind=Refusal.RATE_LIMITED, retry_after=retry, code=429)
        if error in _GONE_ERRORS:
            return SurfaceError(error, kind=Refusal.GONE, code=status)
        if status >= 500:
            return SurfaceError(error, kind=Refusal.TRANSIENT, code=status)
        return SurfaceError(error, kind=Refusal.REFUSED, code=status)
    return SurfaceError(str(exc) or type(exc).__name__, kind=Refusal.TRANSIENT)


def _ts_number(ts: str) -> int:
    """A message's ``ts`` (``1712345678.000100``) as the port's integer id."""
    seconds, _, micros = ts.partition(".")
    return int(seconds) * 1_000_000 + int(micros.ljust(6, "0")[:6] or 0)


def _ts_of(number: int) -> str:
    return f"{number // 1_000_000}.{number % 1_000_000:06d}"


class SlackAdapter(SplitSend, BasePlatformAdapter):
    """See the module docstring."""

    platform = Platform.SLACK
    supports_async_delivery = True

    def __init__(
        self,
        *,
        bot_token: str,
        turns: TurnService,
        records: SlackRecords,
        app_token: str = "",
        signing_secret: str = "",
        base_url: str = DEFAULT_BASE_URL,
        allowed_users: frozenset[str] = frozenset(),
        approvals: Approvals | None = None,
        edit_interval: float = 1.5,
        wake_wait_seconds: float = 240.0,
    ) -> None:
        super().__init__()
        if not (app_token or signing_secret):
            raise ValueError("Slack needs SLACK_APP_TOKEN (Socket Mode) or SLACK_SIGNING_SECRET")
        self.turns = turns
        self.records = records
        self.app_token = app_token
        self.signing_secret = signing_secret
        self.base_url = base_url.rstrip("/") + "/"
        self.allowed_users = frozenset(str(u).strip() for u in allowed_users if str(u).strip())
        self.approvals = approvals
        # Names this bot's inbox, lease and turn keys without holding its token.
        self.bot = "slack:" + hashlib.sha256(bot_token.encode()).hexdigest()[:16]
        self.web = AsyncWebClient(token=bot_token, base_url=self.base_url)
        self.limits = SurfaceLimits(MAX_MESSAGE_LENGTH, can_edit=True, edit_interval=edit_interval)
        self.chat = ChatTurns(
            self, turns, records, key_prefix=self.bot, wake_wait_seconds=wake_wait_seconds
        )
        self.socket = SocketMode(app_token, self.base_url, self._take_envelope)
        self.ignored_messages = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._in_hand: set[int] = set()
        self._intake: asyncio.Task[None] | None = None
        if approvals is not None:
            turns.on_approval = self.ask_approval
        self.set_message_handler(self.chat.wake)

    # ----------------------------------------------------------------- routes

    def routes(self) -> list[tuple[str, Handler]]:
        """The Events API's and interactivity's paths and handlers, for the API server's
        port (none without a signing secret)."""
        if not self.signing_secret:
            return []
        return [
            ("/slack/events", events_handler(self.signing_secret, self.take_event)),
            ("/slack/interactivity", interactivity_handler(self.signing_secret, self.take_press)),
            ("/slack/commands", commands_handler(self.signing_secret, self.on_command)),
        ]

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        if not self.allowed_users:
            logger.warning("Slack: SLACK_ALLOWED_USERS is empty: the bot answers nobody")
        else:
            logger.info("Slack: allowed users: %s", ", ".join(sorted(self.allowed_users)))
        await self._check_token()
        if self.app_token:
            await self.socket.check()
        await asyncio.to_thread(self.records.prune)
        # Events a previous run (or a dead server) took but did not answer come first.
        for update_id, update in await asyncio.to_thread(self.records.claim_orphans, self.bot):
            self._dispatch(update_id, update)
        # Socket Mode runs only while this server holds the bot's lease; a refused app token
        # turns it off for good.
        intake = LeasedIntake(
            self.records,
            self.bot,
            self._dispatch,
            self.socket if self.app_token else None,
            _WORDS,
            in_hand=self._in_hand,
            final=(SlackTokenRefused,),
        )
        self._intake = asyncio.create_task(intake.run(), name="slack-intake")

    async def _check_token(self) -> None:
        try:
            who = await self.web.auth_test()
        except SlackApiError as exc:
            error = str(exc.response.get("error") or "")
            if error in REFUSED_TOKEN_ERRORS:
                raise SlackTokenRefused(
                    f"Slack refused SLACK_BOT_TOKEN at {self.base_url} ({error}); copy the "
                    "bot token again from the app's OAuth & Permissions page"
                ) from None
            logger.warning("Slack: auth.test failed (%s); starting anyway", error or exc)
            return
        except _CALL_ERRORS as exc:
            # An outage or a network blip must not keep the server from starting.
            logger.warning("Slack: cannot reach %s (%s); starting anyway", self.base_url, exc)
            return
        logger.info("Slack: connected as %s in team %s", who.get("user_id"), who.get("team_id"))

    async def stop(self, *, grace_seconds: float = 10.0) -> None:
        if self._intake is not None:
            await _cancel(self._intake)
            self._intake = None
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.records.release_poll_lease, self.bot)
        await finish_or_cancel(self._tasks, grace_seconds)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ----------------------------------------------------------------- intake

    async def _take_envelope(self, kind: str, payload: JSONObject) -> JSONObject | None:
        if kind == "slash_commands":
            return await self.on_command(payload)
        if kind == "interactive":
            await self.take_press(payload)
        else:
            await self.take_event(payload)
        return None

    async def on_command(self, payload: JSONObject) -> JSONObject:
        """``/reveille new|help|timers``: answered by the bot itself (no turn), to the user
        who typed it only; ``new`` maps the chat to a fresh session, kept in the store."""
        command = command_of(payload)
        if command is None or command.user not in self.allowed_users:
            self.ignored_messages += 1
            return _ephemeral("You are not on this bot's list of users.")
        source = command.source
        base = slack_session_id(source)
        old = await asyncio.to_thread(self.records.chat_session, base) or base
        if command.word == "new":
            fresh = f"{base}:new-{secrets.token_hex(4)}"
            if not is_valid_session_id(fresh):
                fresh = "slack_" + hashlib.sha256(fresh.encode()).hexdigest()[:32]
            # Only the mapping changes: the old session stays, readable, and what it started
            # still comes home to it.
            await asyncio.to_thread(self.records.start_chat_session, base, fresh)
            return _ephemeral(
                "Started a new conversation: I no longer see what we said before. The "
                f"previous one is kept (session `{old}`)."
            )
        if command.word == "timers":
            return _ephemeral(to_mrkdwn(await asyncio.to_thread(timers_text, old)))
        return _ephemeral(to_mrkdwn(HELP_TEXT))

    async def take_event(self, envelope: JSONObject) -> None:
        """Store an ``event_callback`` body in the inbox and answer it if it is new."""
        event_id = envelope.get("event_id")
        if envelope.get("type") != "event_callback" or not isinstance(event_id, str):
            return
        update: JSONObject = {"update_id": inbox_id(event_id), "envelope": envelope}
        fresh = await asyncio.to_thread(
            self.records.take_updates, self.bot, [update], move_offset=False
        )
        for update_id, taken in fresh:
            self._dispatch(update_id, taken)

    async def take_press(self, payload: JSONObject) -> None:
        """Store a button press (a ``block_actions`` payload) in the inbox by its stable id
        (``press_key``) and decide it if it is new; acknowledged only after this returns, so a
        press Slack saw accepted survives a crash, and one sent again is decided once."""
        key = press_key(payload)
        if key is None:
            return
        update: JSONObject = {"update_id": inbox_id(key), "press": payload}
        fresh = await asyncio.to_thread(
            self.records.take_updates, self.bot, [update], move_offset=False
        )
        for update_id, taken in fresh:
            self._dispatch(update_id, taken)

    def _dispatch(self, update_id: int, update: JSONObject) -> None:
        if update_id in self._in_hand:
            return  # handed out twice (the intake and a takeover): answered once
        self._in_hand.add(update_id)
        task = self._spawn(self._process(update_id, update), f"slack-event-{update_id}")
        task.add_done_callback(lambda _: self._in_hand.discard(update_id))

    async def _process(self, update_id: int, update: JSONObject) -> None:
        try:
            press = update.get("press")
            if isinstance(press, dict):
                # Its own task (this one), never behind the chat's lock: the turn holding
                # that lock waits for this very press.
                await self._decide(press)
            else:
                await self._answer(update.get("envelope"))
        except asyncio.CancelledError:
            raise  # left unanswered in the inbox: the next start (or another server) answers it
        except Exception:
            logger.exception("Slack event %s could not be answered; dropped", update_id)
        await asyncio.to_thread(self.records.mark_answered, self.bot, update_id)

    async def _answer(self, envelope: JSONValue) -> None:
        message = message_of(envelope) if isinstance(envelope, dict) else None
        if message is None:
            return
        if message.user not in self.allowed_users:
            self.ignored_messages += 1
            logger.info(
                "Slack: ignoring a message from %s (not in SLACK_ALLOWED_USERS)", message.user
            )
            return
        source = message.source
        base = slack_session_id(source)
        session_id = await asyncio.to_thread(self.records.chat_session, base) or base
        event = MessageEvent(
            text=message.text, source=source, session_id=session_id, message_id=message.ts
        )
        key = f"{self.bot}:message:{message.channel}:{message.ts}"
        await self.chat.answer_message(event, key=key)

    # ----------------------------------------------------------------- approvals

    async def ask_approval(self, approval: ApprovalRecord) -> None:
        source = await self.chat.source_of(approval.session_id)
        if source is None:
            logger.warning("approval %s has no Slack chat to ask in", approval.id)
            return
        text = to_mrkdwn(question_text(approval))
        blocks = question_blocks(approval, text)
        try:
            await self.web.chat_postMessage(
                channel=source.chat_id, text=text, blocks=blocks, thread_ts=source.thread_id
            )
        except _CALL_ERRORS as exc:
            # Still decidable (``reveille approvals``); the turn waits for it either way.
            logger.warning("could not ask approval %s in %s: %s", approval.id, source.chat_id, exc)

    def owner_of(self, source: SessionSource) -> str | None:
        """The user who started the conversation (a direct chat's user, a channel's or a
        thread's first writer)."""
        return source.user_id

    async def _decide(self, payload: JSONObject) -> None:
        """Decide a stored press (``decide_press``: the owner only, once, in the store) and
        tell the presser; the verdict replaces the question's buttons."""
        pressed = press_of(payload)
        if pressed is None:
            return
        press = pressed.press
        answer = await decide_press(
            self, self.turns.store, self.approvals, press, allowed_users=self.allowed_users
        )
        try:
            if answer.verdict is not None:
                verdict = to_mrkdwn(answer.verdict)
                await self.web.chat_update(
                    channel=pressed.channel, ts=pressed.message_ts, text=verdict, blocks=[]
                )
            await self.web.chat_postEphemeral(
                channel=pressed.channel,
                user=press.user_id,
                text=to_mrkdwn(answer.answer),
                thread_ts=pressed.thread_ts,
            )
        except _CALL_ERRORS as exc:
            logger.warning("Slack: could not answer the press in %s: %s", pressed.channel, exc)

    # ----------------------------------------------------------------- sending (the port)

    def split(self, text: str) -> list[str]:
        return split_message(text, self.limits.max_message_chars)

    async def send_text(self, to: SessionSource, text: str, *, edit: int | None = None) -> int:
        """Send one piece as ``split`` made it (mrkdwn already)."""
        body = text or "(no reply)"
        try:
            if edit is not None:
                await self.web.chat_update(channel=to.chat_id, ts=_ts_of(edit), text=body)
                return edit
            sent = await self.web.chat_postMessage(
                channel=to.chat_id,
                text=body,
                thread_ts=to.thread_id,
                mrkdwn=True,
                unfurl_links=False,
                unfurl_media=False,
            )
        except _CALL_ERRORS as exc:
            raise surface_error(exc) from exc
        return _ts_number(str(sent.get("ts") or "0"))

    async def typing(self, to: SessionSource) -> None:
        """Slack's Web API has no typing indicator for a bot: nothing to show."""
        return None


def _ephemeral(text: str) -> JSONObject:
    """A slash command's answer, shown to the user who typed it only."""
    return {"response_type": "ephemeral", "text": text}


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
