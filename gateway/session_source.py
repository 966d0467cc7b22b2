"""Where a conversation came from and how it is routed: ``SessionSource`` (platform, chat,
thread, user) and ``build_session_key``, the deterministic routing key that completion
events carry (``session_key``), so a wake-up finds the chat that started the work.

Kept apart from the session store (``gateway.session``, which re-exports both): a source is
what a surface knows about a chat, before and without any stored session.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.config import Platform

__all__ = ["SessionSource", "build_session_key", "chat_session_key"]


def _coerce_text(value: Any, name: str, *, required: bool) -> str | None:
    if value is None:
        if required:
            raise ValueError(f"SessionSource: missing required field {name!r}")
        return None
    # bool is an int subclass; True as a chat id is always a bug upstream.
    if isinstance(value, bool):
        raise ValueError(f"SessionSource: {name} must be a string, got bool")
    if isinstance(value, int):
        # Platforms such as Telegram hand out numeric ids; the key and JSON want text.
        return str(value)
    if not isinstance(value, str):
        raise ValueError(f"SessionSource: {name} must be a string, got {type(value).__name__}")
    if required and not value:
        raise ValueError(f"SessionSource: {name} must not be empty")
    return value


def _coerce_platform(value: Any) -> Platform:
    try:
        return Platform(value)
    except (ValueError, TypeError):
        known = ", ".join(p.value for p in Platform)
        raise ValueError(
            f"SessionSource: unknown platform {value!r} (expected one of: {known})"
        ) from None


@dataclass
class SessionSource:
    """Where a conversation originates: enough to route a reply or wake-up back to it."""

    platform: Platform
    chat_id: str
    chat_type: str = "dm"
    user_id: str | None = None
    user_name: str | None = None
    thread_id: str | None = None
    chat_name: str | None = None
    chat_topic: str | None = None
    """The channel's topic or description, where the platform has one."""
    user_id_alt: str | None = None
    """A platform's second stable user id (e.g. a Signal UUID beside the phone number)."""

    def __post_init__(self) -> None:
        # Accept "telegram" as well as Platform.TELEGRAM, and numeric ids, so that a source
        # built by an adapter equals the same source read back from JSON.
        if type(self.platform) is not Platform:  # a member already: nothing to coerce
            self.platform = _coerce_platform(self.platform)
        for name in ("chat_id", "user_id", "thread_id", "user_id_alt"):
            value = getattr(self, name)
            if isinstance(value, int) and not isinstance(value, bool):
                setattr(self, name, str(value))

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form; ``from_dict(to_dict())`` returns an equal source."""
        return {
            "platform": self.platform.value,
            "chat_id": self.chat_id,
            "chat_type": self.chat_type,
            "user_id": self.user_id,
            "user_name": self.user_name,
            "thread_id": self.thread_id,
            "chat_name": self.chat_name,
            "chat_topic": self.chat_topic,
            "user_id_alt": self.user_id_alt,
        }

    def to_json(self) -> str:
        """``json.dumps(self.to_dict(), sort_keys=True)``, the form a session stores. A source
        that is only a platform and a chat (every API conversation's, one per new session)
        fills a template with its two strings, each encoded as ``json.dumps`` encodes it:
        the same text without the encoder's calls."""
        if (
            self.chat_type == "dm"
            and self.user_id is None
            and self.user_name is None
            and self.thread_id is None
            and self.chat_name is None
            and self.chat_topic is None
            and self.user_id_alt is None
            and isinstance(self.chat_id, str)
            and type(self.platform) is Platform
        ):
            return _CHAT_ONLY_JSON % (
                _json_string(self.chat_id),
                _json_string(self.platform),  # a StrEnum: its text is its value
            )
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SessionSource:
        """Validate and build a source from persisted or wire data.

        Raises ValueError for a non-mapping, an unknown platform, a missing/empty chat_id or
        wrongly typed fields. Unknown keys are ignored so newer writers stay readable.
        """
        if not isinstance(d, Mapping):
            raise ValueError(f"SessionSource.from_dict expects a mapping, got {type(d).__name__}")
        platform = _coerce_platform(d.get("platform"))
        user_id = _coerce_text(d.get("user_id"), "user_id", required=False)
        # A source without a chat is anchored on its user (see build_session_key).
        chat_id = _coerce_text(d.get("chat_id"), "chat_id", required=not user_id) or ""
        chat_type = d.get("chat_type")
        if chat_type is None:
            chat_type = "dm"
        elif not isinstance(chat_type, str) or not chat_type:
            raise ValueError("SessionSource: chat_type must be a non-empty string")
        return cls(
            platform=platform,
            chat_id=chat_id,
            chat_type=chat_type,
            user_id=user_id,
            user_name=_coerce_text(d.get("user_name"), "user_name", required=False),
            thread_id=_coerce_text(d.get("thread_id"), "thread_id", required=False),
            chat_name=_coerce_text(d.get("chat_name"), "chat_name", required=False),
            chat_topic=_coerce_text(d.get("chat_topic"), "chat_topic", required=False),
            user_id_alt=_coerce_text(d.get("user_id_alt"), "user_id_alt", required=False),
        )


# ``json.dumps(source.to_dict(), sort_keys=True)`` of a source that has only its platform
# and chat id (the rest at their defaults), with ``%s`` for those two encoded strings.
_CHAT_ONLY_JSON = (
    '{"chat_id": %s, "chat_name": null, "chat_topic": null, "chat_type": "dm", '
    '"platform": %s, "thread_id": null, "user_id": null, "user_id_alt": null, '
    '"user_name": null}'
)
_json_string = json.encoder.encode_basestring_ascii  # what json.dumps encodes a str with


def _escape_key_part(value: str) -> str:
    # A prefix-free substitution (only '%' and ':' change), so the escaped text never
    # contains ':' and decodes uniquely: the key splits back into its exact components and
    # two different sources can never produce the same key.
    return value.replace("%", "%25").replace(":", "%3A")


def build_session_key(
    source: SessionSource,
    agent: str = "main",
    *,
    group_sessions_per_user: bool = False,
    thread_sessions_per_user: bool = False,
) -> str:
    """Deterministic routing key, e.g. ``agent:main:telegram:group:chat-1[:thread:<id>]``.

    Every free-form component is escaped so chat ids containing ':' cannot collide with a
    different chat/thread combination. An empty thread_id counts as "no thread".

    A source without a chat id is anchored on its user (``...:dm::user:<id>``): one key for
    every user of a platform would be one conversation shared by all of them. Both empty is
    refused. ``group_sessions_per_user`` gives each participant of a group chat (outside a
    thread) a conversation of their own, ``thread_sessions_per_user`` the same inside
    threads (the keywords of hermes-agent's function; off by default here, where a chat or
    forum topic is one conversation).
    """
    if (
        agent == "main"
        and not source.thread_id
        and not source.user_id
        and source.chat_type == "dm"
        and source.chat_id
        and isinstance(source.chat_id, str)
        and type(source.platform) is Platform
    ):
        # A chat alone: its key is a platform's chat's key (cached; asked again by the turn
        # that stores a new session).
        return chat_session_key(source.platform, source.chat_id)
    if not agent:
        raise ValueError("build_session_key: agent must be a non-empty string")
    platform = _coerce_platform(source.platform)
    chat_id = str(source.chat_id or "")
    user_id = str(source.user_id or "")
    if not chat_id and not user_id:
        raise ValueError("build_session_key: the source has neither a chat_id nor a user_id")
    parts = [
        "agent",
        _escape_key_part(agent),
        _escape_key_part(platform.value),
        _escape_key_part(str(source.chat_type)),
        _escape_key_part(chat_id),
    ]
    if source.thread_id:
        parts += ["thread", _escape_key_part(str(source.thread_id))]
    per_user = thread_sessions_per_user if source.thread_id else group_sessions_per_user
    is_dm = str(source.chat_type) == "dm"
    if user_id and (not chat_id or (per_user and not is_dm)):
        parts += ["user", _escape_key_part(user_id)]
    return ":".join(parts)


@functools.lru_cache(maxsize=4096)
def chat_session_key(platform: Platform, chat_id: str) -> str:
    """``build_session_key`` of the source that is ``platform``'s chat ``chat_id`` and nothing
    else (a direct message, no thread, no user): the key of every session of a surface whose
    chats are its sessions (the API server's, the web UI's). Asked by every turn, twice by a
    new conversation's (its tools' context, the session it stores): built without a source,
    and cached, since a conversation's turns follow each other."""
    if not chat_id:
        raise ValueError("build_session_key: the source has neither a chat_id nor a user_id")
    if type(platform) is not Platform:
        platform = _coerce_platform(platform)
    # A StrEnum member is its value's text: escaped as it is, without the enum's ``value``.
    return f"agent:main:{_escape_key_part(platform)}:dm:{_escape_key_part(chat_id)}"
