"""What the Discord adapter takes in: a message's or an interaction's chat as a
``SessionSource``, the session it goes to, and the records that make each answered once.

A conversation is a channel: a direct message channel (``dm``), a guild text channel
(``channel``, one conversation for everyone in it, owned by the user who started it) or a
thread (``thread``: a thread is a channel of its own on Discord, so its id is the chat id
and it is a conversation apart from its parent). The session id is the routing key of that
source (``build_session_key``), as on every chat surface; ``/new`` maps the chat to a fresh
one (``DiscordRecords.start_chat_session``).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from typing import Any, Protocol

import discord

from gateway.config import Platform
from gateway.session import SessionSource, build_session_key, is_valid_session_id
from gateway.surfaces.port import ReplyRecords

__all__ = [
    "DiscordRecords",
    "MemoryRecords",
    "discord_session_id",
    "source_of_interaction",
    "source_of_message",
    "text_of",
]

_THREAD_TYPES = frozenset({10, 11, 12})  # news, public and private threads


def discord_session_id(source: SessionSource) -> str:
    """The session of a chat: its routing key, which is a valid session id."""
    key = build_session_key(source)
    if not is_valid_session_id(key):  # snowflakes never trip this; be safe anyway
        key = "discord_" + hashlib.sha256(key.encode()).hexdigest()[:32]
    return key


def text_of(message: discord.Message, bot_id: str) -> str:
    """What the user wrote, without the bot's own mention in front (``@bot hello`` in a
    guild channel is "hello" to the agent)."""
    text = message.content.strip()
    for mention in (f"<@{bot_id}>", f"<@!{bot_id}>"):
        if bot_id and text.startswith(mention):
            return text[len(mention) :].strip()
    return text


def _chat_type(guild_id: int | None, channel_type: int | None) -> str:
    if guild_id is None:
        return "dm"
    return "thread" if channel_type in _THREAD_TYPES else "channel"


def _name(user: discord.abc.User) -> str:
    return str(getattr(user, "global_name", None) or user.name)


def source_of_message(message: discord.Message) -> SessionSource:
    """The chat a message was written in (see the module docstring)."""
    channel = message.channel
    kind = getattr(getattr(channel, "type", None), "value", None)
    return SessionSource(
        platform=Platform.DISCORD,
        chat_id=str(channel.id),
        chat_type=_chat_type(message.guild.id if message.guild else None, kind),
        user_id=str(message.author.id),
        user_name=_name(message.author),
        chat_name=str(getattr(channel, "name", "") or "") or None,
    )


def source_of_interaction(interaction: discord.Interaction[Any]) -> SessionSource | None:
    """The chat a slash command or a button press came from; None without a channel."""
    if interaction.channel_id is None:
        return None
    channel = interaction.channel
    kind = getattr(getattr(channel, "type", None), "value", None)
    return SessionSource(
        platform=Platform.DISCORD,
        chat_id=str(interaction.channel_id),
        chat_type=_chat_type(interaction.guild_id, kind),
        user_id=str(interaction.user.id),
        user_name=_name(interaction.user),
        chat_name=str(getattr(channel, "name", "") or "") or None,
    )


class DiscordRecords(ReplyRecords, Protocol):
    """The reply records of the port, and the chat-to-session map ``/new`` moves."""

    def chat_session(self, chat_key: str) -> str | None: ...

    def start_chat_session(self, chat_key: str, session_id: str) -> None: ...


class MemoryRecords:
    """``DiscordRecords`` in this process's memory: a message re-delivered to this server
    (a RESUME replays what the socket missed) is answered once, and a reply re-run edits the
    pieces it sent. Not shared between servers nor kept over a restart; a reply's records are
    forgotten ``keep_seconds`` after it began (Discord replays a socket's events for minutes,
    not days), so a long-running bot does not grow without end."""

    def __init__(self, keep_seconds: float = 24 * 3600.0) -> None:
        self.keep_seconds = keep_seconds
        self._lock = threading.Lock()
        self._begun: OrderedDict[str, float] = OrderedDict()  # key -> first seen, oldest first
        self._parts: dict[str, dict[int, int]] = {}
        self._finished: set[str] = set()
        self._chats: dict[str, str] = {}

    def _touch(self, key: str) -> None:
        """Note ``key`` (under the lock) and forget the replies begun too long ago."""
        now = time.monotonic()
        while self._begun:
            oldest, at = next(iter(self._begun.items()))
            if now - at < self.keep_seconds:
                break
            del self._begun[oldest]
            self._parts.pop(oldest, None)
            self._finished.discard(oldest)
        self._begun.setdefault(key, now)

    def reply_finished(self, key: str) -> bool:
        with self._lock:
            return key in self._finished

    def reply_parts(self, key: str) -> dict[int, int]:
        with self._lock:
            return dict(self._parts.get(key, {}))

    def record_part(self, key: str, part: int, chat_id: str, message_id: int) -> None:
        with self._lock:
            self._touch(key)
            self._parts.setdefault(key, {})[part] = message_id

    def finish_reply(self, key: str) -> None:
        with self._lock:
            self._touch(key)
            self._finished.add(key)
            self._parts.pop(key, None)

    def chat_session(self, chat_key: str) -> str | None:
        with self._lock:
            return self._chats.get(chat_key)

    def start_chat_session(self, chat_key: str, session_id: str) -> None:
        with self._lock:
            self._chats[chat_key] = session_id
