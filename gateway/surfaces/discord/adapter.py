"""The Discord adapter: a chat surface (``gateway.surfaces.port.ChatSurface``) over discord.py.

Started by ``reveille serve`` when ``DISCORD_BOT_TOKEN`` is set. The bot keeps one Gateway
connection (discord.py's ``AutoShardedClient``: the Gateway URL and shard count come from
``GET /gateway/bot``) and speaks REST v10 for everything it sends.

* Where Discord is: by default discord.com. ``DISCORD_API_BASE`` (a proxy, or the stand-in the
  tests run) moves the REST root, through the one knob discord.py has for it:
  ``discord.http.Route.BASE``, the class attribute its own ``_set_api_version`` rewrites (every
  request URL is built from it when the request is made). The Gateway needs no knob of its own:
  the URL is the one ``GET /gateway/bot`` answers on that root (the reason for
  ``AutoShardedClient``: the plain ``Client`` never asks, it dials ``DEFAULT_GATEWAY``), and a
  RESUME goes to the ``resume_gateway_url`` of READY. Only a fresh IDENTIFY after an
  invalidated session falls back to ``DiscordWebSocket.DEFAULT_GATEWAY``, so with a custom root
  that is set to the same answer. ``Client(proxy=...)`` was not chosen: an HTTP proxy tunnels
  TLS to discord.com, so a stand-in would have to impersonate discord.com's certificate.
  Nothing of the library is patched; both attributes are process-wide, as the API version is
  (one bot per process).
* Start: a token Discord refuses stops the start (``DiscordTokenRefused``, one line); Discord
  unreachable does not: the login is retried in the background, waiting longer each time.
* Messages (direct messages, guild channels, threads; ``intake``) from users in
  ``allowed_users`` are answered through ``ChatTurns.answer_message``, keyed by the message's
  snowflake, one chat at a time in order; anyone else's message gets nothing (counted and
  logged). With nobody allowed the bot answers nobody, and says so at start.
* After a crash: Discord does not deliver a message again to a new connection, so each
  READY reads back the channels of recently active Discord sessions (``recover``) and takes
  again what users wrote after the bot's last message there.
* Replies are markdown (``format``): streamed into the first message by editing it, split at
  2,000 characters with code fences balanced, sent with no allowed mentions (a model's
  ``@everyone`` pings nobody).
* ``/new``, ``/timers`` and ``/help`` are application commands, registered at start (a bulk
  overwrite of the global commands): ``/new`` maps the chat to a fresh session (the old one is
  kept and its late results still come home to it), ``/timers`` lists the chat's reminders and
  schedules (``gateway.surfaces.timers``; typed as text it is answered by ``ChatTurns``),
  ``/help`` says what the bot does. Other typed text that only looks like a command is an
  ordinary message.
* Approvals are buttons (``approvals``); only the conversation's owner decides.
* Wake-ups: ``handle_message`` with an internal event goes to ``ChatTurns.wake``, the rules
  every chat surface shares.
* Errors: a 429 is waited out by discord.py itself for its ``Retry-After`` (up to 30 s;
  longer: ``RATE_LIMITED`` with the wait, honoured above the port); 403 Missing Permissions
  (50013), Missing Access (50001), Cannot send messages to this user (50007) and 404 Unknown
  Channel (10003) are ``GONE``: dropped with Discord's words as the reason; 5xx and
  connection failures are ``TRANSIENT``; any other refusal is ``REFUSED``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import aiohttp
import discord
import yarl
from discord import app_commands
from discord.gateway import DiscordWebSocket

from gateway.adapter import BasePlatformAdapter, MessageEvent
from gateway.approvals import ApprovalRecord, Approvals
from gateway.config import Platform
from gateway.session import SessionSource, is_valid_session_id
from gateway.surfaces.approval_press import decide_press
from gateway.surfaces.chat import ChatTurns
from gateway.surfaces.discord.approvals import approval_view, parse_press, question_text
from gateway.surfaces.discord.format import MAX_MESSAGE_LENGTH, split_message, to_discord
from gateway.surfaces.discord.intake import (
    DiscordRecords,
    MemoryRecords,
    discord_session_id,
    source_of_interaction,
    source_of_message,
    text_of,
)
from gateway.surfaces.port import Refusal, SplitSend, SurfaceError, SurfaceLimits
from gateway.surfaces.timers import timers_answer
from gateway.turns.service import TurnService

__all__ = ["HELP_TEXT", "DiscordAdapter", "DiscordTokenRefused", "surface_error"]

logger = logging.getLogger(__name__)

# The library waits out a 429 itself up to this long (its minimum); longer is ours.
_MAX_LIBRARY_WAIT_SECONDS = 30.0
# The first wait before logging in again when Discord could not be reached (it doubles).
LOGIN_RETRY_SECONDS = 1.0
# How far back a start reads a channel for messages a killed run never answered, and how
# many of the most recently active sessions' channels (and messages of each) it reads.
RECOVER_SECONDS = 15 * 60.0
_RECOVER_SESSIONS = 50
_RECOVER_MESSAGES = 50
# Discord's codes for a chat the bot can no longer write to.
_GONE_CODES = frozenset({10003, 50001, 50007, 50013})

HELP_TEXT = (
    "I am Reveille: an agent whose background work comes home.\n\n"
    "Write to me as you would to anyone. Ask for something long 'in the background' and "
    "go on talking: when the work is done, its result comes back here as a new message.\n\n"
    "`/new` starts a fresh conversation (the old one is kept).\n"
    "`/timers` lists the reminders and schedules of this chat.\n"
    "`/help` shows this again."
)


class DiscordTokenRefused(RuntimeError):
    """The bot token was refused at start (401 from ``users/@me``)."""


def surface_error(exc: Exception) -> SurfaceError:
    """A failed Discord call as the port classifies it (see the module docstring)."""
    if isinstance(exc, discord.RateLimited):
        return SurfaceError(
            f"rate limited for {exc.retry_after:.1f}s",
            kind=Refusal.RATE_LIMITED,
            retry_after=exc.retry_after,
            code=429,
        )
    if isinstance(exc, discord.HTTPException):
        reason = f"{exc.text or exc.response.reason} ({exc.code or exc.status})"
        if exc.status == 429:
            retry = float(exc.response.headers.get("Retry-After") or 1.0)
            return SurfaceError(reason, kind=Refusal.RATE_LIMITED, retry_after=retry, code=429)
        if exc.code in _GONE_CODES:
            return SurfaceError(reason, kind=Refusal.GONE, code=exc.code)
        if exc.status >= 500:
            return SurfaceError(reason, kind=Refusal.TRANSIENT, code=exc.status)
        return SurfaceError(reason, kind=Refusal.REFUSED, code=exc.code or exc.status)
    return SurfaceError(str(exc) or type(exc).__name__, kind=Refusal.TRANSIENT)


_CALL_ERRORS = (discord.HTTPException, discord.RateLimited, aiohttp.ClientError, OSError)


class _Bot(discord.AutoShardedClient):
    """The discord.py client; its events go to the adapter."""

    def __init__(self, adapter: DiscordAdapter) -> None:
        intents = discord.Intents.default()
        intents.message_content = True  # privileged: enable it in the developer portal
        super().__init__(
            intents=intents,
            max_ratelimit_timeout=_MAX_LIBRARY_WAIT_SECONDS,
            allowed_mentions=discord.AllowedMentions.none(),
        )
        self.adapter = adapter
        self.tree = app_commands.CommandTree(self)

        @self.tree.command(name="new", description="Start a fresh conversation here")
        async def new(interaction: discord.Interaction[Any]) -> None:
            await adapter.on_command(interaction, "new")

        @self.tree.command(name="timers", description="The reminders and schedules of this chat")
        async def timers(interaction: discord.Interaction[Any]) -> None:
            await adapter.on_command(interaction, "timers")

        @self.tree.command(name="help", description="What this bot does")
        async def help_(interaction: discord.Interaction[Any]) -> None:
            await adapter.on_command(interaction, "help")

    async def setup_hook(self) -> None:
        await self.adapter.before_connect()

    async def on_ready(self) -> None:
        logger.info("Discord: connected as %s", self.user)
        await self.adapter.recover()

    async def on_message(self, message: discord.Message) -> None:
        await self.adapter.on_message(message)

    async def on_interaction(self, interaction: discord.Interaction[Any]) -> None:
        if interaction.type is discord.InteractionType.component:
            await self.adapter.on_press(interaction)


class DiscordAdapter(SplitSend, BasePlatformAdapter):
    """See the module docstring."""

    platform = Platform.DISCORD
    supports_async_delivery = True

    def __init__(
        self,
        *,
        token: str,
        turns: TurnService,
        allowed_users: frozenset[str] = frozenset(),
        api_base: str = "",
        records: DiscordRecords | None = None,
        approvals: Approvals | None = None,
        edit_interval: float = 1.5,
        wake_wait_seconds: float = 240.0,
    ) -> None:
        super().__init__()
        self.token = token
        self.turns = turns
        self.allowed_users = frozenset(str(u).strip() for u in allowed_users if str(u).strip())
        self.api_base = api_base.rstrip("/")
        self.records: DiscordRecords = records if records is not None else MemoryRecords()
        self.approvals = approvals
        self.limits = SurfaceLimits(MAX_MESSAGE_LENGTH, can_edit=True, edit_interval=edit_interval)
        self.chat = ChatTurns(
            self, turns, self.records, key_prefix="discord", wake_wait_seconds=wake_wait_seconds
        )
        self.client = _Bot(self)
        self.ignored_messages = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._connection: asyncio.Task[None] | None = None
        self._stopping = False
        if approvals is not None:
            turns.on_approval = self.ask_approval
        self.set_message_handler(self.chat.wake)

    @property
    def bot(self) -> str:
        """The bot's user id once logged in (names its wake-up keys)."""
        user = self.client.user
        return str(user.id) if user is not None else ""

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        if not self.allowed_users:
            logger.warning(
                "Discord: no allowed users configured (DISCORD_ALLOWED_USERS); the bot "
                "answers nobody"
            )
        else:
            logger.info("Discord: allowed users: %s", ", ".join(sorted(self.allowed_users)))
        if self.api_base:
            discord.http.Route.BASE = self.api_base
        try:
            logged_in = await self._login()
        except DiscordTokenRefused:
            await self.client.close()
            raise
        self._connection = asyncio.create_task(self._connect(logged_in), name="discord-gateway")

    async def _login(self) -> bool:
        """Log in (``users/@me``, the application); False when Discord cannot be reached
        now (the caller retries), ``DiscordTokenRefused`` when the token is wrong."""
        try:
            await self.client.login(self.token)
            return True
        except discord.LoginFailure as exc:
            raise DiscordTokenRefused(
                f"Discord refused DISCORD_BOT_TOKEN at {discord.http.Route.BASE} ({exc}); "
                "copy the bot's token again from the developer portal"
            ) from None
        except _CALL_ERRORS as exc:
            # An outage or a network blip must not keep the server from starting.
            logger.warning(
                "Discord: cannot log in at %s (%s); retrying", discord.http.Route.BASE, exc
            )
            # A client that failed to log in is not logged in again: the next try gets
            # a fresh one (its HTTP session closed with the old).
            await self.client.close()
            self.client = _Bot(self)
            return False

    async def _connect(self, logged_in: bool) -> None:
        delay = LOGIN_RETRY_SECONDS
        try:
            while not logged_in:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 60.0)
                logged_in = await self._login()
            await self.client.connect(reconnect=True)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("Discord: the Gateway connection ended for good")

    async def before_connect(self) -> None:
        """Logged in, not connected yet: point a fresh IDENTIFY at the configured root's
        Gateway, and register the application commands."""
        if self.api_base:
            _, url, _ = await self.client.http.get_bot_gateway()
            DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(url)
        try:
            await self.client.tree.sync()
        except _CALL_ERRORS as exc:
            logger.warning("Discord: could not register its commands: %s", exc)

    async def stop(self, *, grace_seconds: float = 10.0) -> None:
        """Take no more messages, give the answers in flight ``grace_seconds``, cancel the
        rest, disconnect. The socket stays open meanwhile: replies need the same client."""
        self._stopping = True
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=grace_seconds)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        await self.client.close()
        if self._connection is not None:
            self._connection.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._connection

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ----------------------------------------------------------------- intake

    def _allowed(self, user_id: str) -> bool:
        return user_id in self.allowed_users

    async def on_message(self, message: discord.Message) -> None:
        text = text_of(message, self.bot)
        if message.author.bot or not text:
            return
        self._take(source_of_message(message), message.id, text)

    def _take(self, source: SessionSource, message_id: int, text: str) -> None:
        """A user's message, taken to be answered (or refused: stopping, not allowed)."""
        if self._stopping:
            # Discord will not deliver it again; said, so that it is not lost silently
            # (the next start recovers it: ``recover``).
            logger.warning(
                "Discord: stopping; message %s in %s not taken", message_id, source.chat_id
            )
            return
        if source.user_id is None or not self._allowed(source.user_id):
            self.ignored_messages += 1
            logger.info(
                "Discord: ignoring a message from user %s (not in DISCORD_ALLOWED_USERS)",
                source.user_id,
            )
            return
        self._spawn(self._answer(source, message_id, text), f"discord-message-{message_id}")

    async def recover(self) -> None:
        """Messages a previous run took but never answered (killed before its reply
        reached the chat): Discord does not deliver them to a new connection, so each
        channel of a recently active Discord session is read back, newest first, down to
        the bot's own last message; what users wrote after it (within ``RECOVER_SECONDS``)
        is taken again. Its turn key makes a turn that already ran answer from the store."""
        since = time.time() - RECOVER_SECONDS
        sessions = await asyncio.to_thread(self.turns.store.list_sessions, _RECOVER_SESSIONS, 0)
        chats: dict[str, SessionSource] = {}
        for session in sessions:  # most recently active first
            if session.updated_at < since:
                break
            if isinstance(session.source, dict):
                source = SessionSource.from_dict(session.source)
                if source.platform is Platform.DISCORD:
                    chats.setdefault(source.chat_id, source)
        for chat_id, stored in chats.items():
            try:
                missed = await self._unanswered(int(chat_id), since)
            except (*_CALL_ERRORS, ValueError) as exc:
                logger.warning("Discord: could not read back channel %s: %s", chat_id, exc)
                continue
            for message in missed:
                text = text_of(message, self.bot)
                if message.author.bot or not text:
                    continue
                logger.info("Discord: message %s in %s taken again", message.id, chat_id)
                # The stored source names the chat (a history read knows no guild).
                source = replace(
                    stored, user_id=str(message.author.id), user_name=str(message.author)
                )
                self._take(source, message.id, text)

    async def _unanswered(self, channel_id: int, since: float) -> list[discord.Message]:
        """What users wrote in a channel after the bot's last message, oldest first."""
        me = self.client.user
        found: list[discord.Message] = []
        channel = self.client.get_partial_messageable(channel_id)
        async for message in channel.history(limit=_RECOVER_MESSAGES):
            if (me is not None and message.author.id == me.id) or (
                message.created_at.timestamp() < since
            ):
                break
            found.append(message)
        found.reverse()
        return found

    async def _answer(self, source: SessionSource, message_id: int, text: str) -> None:
        session_id = await self._session_of(source)
        key = f"discord:message:{message_id}"
        try:
            event = MessageEvent(
                text=text, source=source, session_id=session_id, message_id=str(message_id)
            )
            await self.chat.answer_message(event, key=key)
        except Exception:
            logger.exception("Discord message %s could not be answered; dropped", message_id)

    async def on_command(self, interaction: discord.Interaction[Any], name: str) -> None:
        """``/new``, ``/timers`` or ``/help``: answered by the bot itself, no turn."""
        source = source_of_interaction(interaction)
        if source is None or not self._allowed(str(interaction.user.id)):
            self.ignored_messages += 1
            await self._respond(interaction, "You are not on this bot's list of users.")
            return
        if name == "help":
            await self._respond(interaction, HELP_TEXT)
            return
        old = await self._session_of(source)
        if name == "timers":
            # One response per interaction: the listing's first 2,000 characters.
            await self._respond(interaction, self.split(await timers_answer(old))[0])
            return
        base = discord_session_id(source)
        fresh = f"{base}:new-{secrets.token_hex(4)}"
        if not is_valid_session_id(fresh):
            fresh = "discord_" + hashlib.sha256(fresh.encode()).hexdigest()[:32]
        # Only the mapping changes: the old session stays, readable, and what it started
        # still comes home to it.
        await asyncio.to_thread(self.records.start_chat_session, base, fresh)
        await self._respond(
            interaction,
            "Started a new conversation: I no longer see what we said before. The previous "
            f"one is kept (session `{old}`).",
            ephemeral=False,
        )

    async def _respond(
        self, interaction: discord.Interaction[Any], text: str, *, ephemeral: bool = True
    ) -> None:
        try:
            await interaction.response.send_message(text, ephemeral=ephemeral)
        except _CALL_ERRORS as exc:
            logger.warning("Discord refused the answer to interaction %s: %s", interaction.id, exc)

    async def _session_of(self, source: SessionSource) -> str:
        """The session the chat's messages go to now (``/new`` may have moved it)."""
        base = discord_session_id(source)
        chosen = await asyncio.to_thread(self.records.chat_session, base)
        return chosen or base

    # ----------------------------------------------------------------- approvals

    async def ask_approval(self, approval: ApprovalRecord) -> None:
        source = await self.chat.source_of(approval.session_id)
        if source is None:
            logger.warning("approval %s has no Discord chat to ask in", approval.id)
            return
        view = None if approval.status == "expired" else approval_view(approval.id)
        channel = self.client.get_partial_messageable(int(source.chat_id))
        try:
            if view is None:
                await channel.send(question_text(approval))
            else:
                await channel.send(question_text(approval), view=view)
        except _CALL_ERRORS as exc:
            # Still decidable (``reveille approvals``); the turn waits for it either way.
            logger.warning(
                "could not ask approval %s in channel %s: %s", approval.id, source.chat_id, exc
            )
        finally:
            if view is not None:
                view.stop()  # the buttons are answered in on_press, by custom_id

    def owner_of(self, source: SessionSource) -> str | None:
        """The user who started the conversation (a DM's user, a channel's first writer)."""
        return source.user_id

    async def on_press(self, interaction: discord.Interaction[Any]) -> None:
        # discord.py's interaction payload, a TypedDict union: only ``custom_id`` is read.
        data: Mapping[str, object] = interaction.data or {}
        custom_id = str(data.get("custom_id") or "")
        press = parse_press(custom_id, str(interaction.user.id), str(interaction.channel_id))
        if press is None:
            return
        answer = await decide_press(
            self, self.turns.store, self.approvals, press, allowed_users=self.allowed_users
        )
        try:
            if answer.verdict is not None:
                # The question becomes the verdict, its buttons gone.
                await interaction.response.edit_message(content=answer.verdict, view=None)
            else:
                await interaction.response.send_message(answer.answer, ephemeral=True)
        except _CALL_ERRORS as exc:
            logger.warning("Discord refused the answer to press %s: %s", interaction.id, exc)

    # ----------------------------------------------------------------- sending (the port)

    def split(self, text: str) -> list[str]:
        return split_message(text, self.limits.max_message_chars)

    async def send_text(self, to: SessionSource, text: str, *, edit: int | None = None) -> int:
        channel = self.client.get_partial_messageable(int(to.chat_id))
        # A piece of ``split`` is rewritten already (and ``to_discord`` changes it no more).
        content = to_discord(text) or "\u200b"  # Discord refuses an empty message
        try:
            if edit is None:
                sent = await channel.send(content)
                return sent.id
            await channel.get_partial_message(edit).edit(content=content)
            return edit
        except _CALL_ERRORS as exc:
            raise surface_error(exc) from exc

    async def typing(self, to: SessionSource) -> None:
        with contextlib.suppress(*_CALL_ERRORS):
            await self.client.http.send_typing(int(to.chat_id))
