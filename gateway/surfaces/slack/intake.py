"""What the Slack adapter takes in: an event as a ``SlackMessage`` (its chat as a
``SessionSource``, the session it goes to), a button press as an ``ApprovalPress``, and the
inbox id that makes a re-sent event, or a re-sent press (``press_key``), taken once.

A conversation is a channel or a thread: a direct message channel (``dm``), a channel or
group (``channel``, one conversation for everyone in it, owned by the user who started it)
or a thread in either (``thread``: ``thread_id`` is the thread's ``thread_ts``, a conversation
apart from its channel, replied to in the thread). The session id is the routing key of that
source (``build_session_key``), as on every chat surface.

Events the bot takes: ``message`` (a user's message, not an edit, a join or a bot's) and
``app_mention`` (the same message when it names the bot: both are keyed by the message's
channel and ``ts``, so it is answered once). ``<@U...>`` naming the bot at the front of a
mention is taken off the text.

Every string from Slack is cleaned of lone surrogates (a JSON ``"\\ud800"`` decodes to one;
it could be stored nowhere as UTF-8): each becomes U+FFFD.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from agent.messages import JSONObject, JSONValue
from gateway.config import Platform
from gateway.session import SessionSource, build_session_key, is_valid_session_id
from gateway.surfaces.port import ApprovalPress

__all__ = [
    "APPROVE_ACTION",
    "DENY_ACTION",
    "Press",
    "SlackCommand",
    "SlackMessage",
    "clean",
    "command_of",
    "inbox_id",
    "message_of",
    "press_key",
    "press_of",
    "slack_session_id",
]

APPROVE_ACTION = "reveille_approve"
DENY_ACTION = "reveille_deny"
_MENTION = re.compile(r"^\s*<@[A-Z0-9]+>\s*")
# Message subtypes that are a user's words (none is the plain message).
_USER_SUBTYPES = frozenset({"", "file_share", "thread_broadcast"})


def clean(value: JSONValue) -> JSONValue:
    """``value`` with every lone surrogate in its strings (keys too) replaced by U+FFFD."""
    if isinstance(value, str):
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, list):
        return [clean(v) for v in value]
    if isinstance(value, dict):
        return {str(clean(k)): clean(v) for k, v in value.items()}
    return value


def inbox_id(event_id: str) -> int:
    """The inbox's (integer) id of an event: 60 bits of its ``event_id``'s hash."""
    return int(hashlib.sha256(event_id.encode()).hexdigest()[:15], 16)


def press_key(payload: JSONObject) -> str | None:
    """The stable id of a ``block_actions`` payload, the same each time Slack sends the one
    press again: its first action's ``action_ts`` (else the payload's ``trigger_id``), with
    the presser and the action; None for a payload that is no button press of ours."""
    if press_of(payload) is None:
        return None
    actions, user = payload.get("actions"), payload.get("user")
    assert isinstance(actions, list) and isinstance(actions[0], dict) and isinstance(user, dict)
    action = actions[0]
    when = _str(action.get("action_ts")) or _str(payload.get("trigger_id"))
    if not when:
        # Nothing Slack made unique: the payload itself, so a resend is still one press.
        when = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()
    return f"press:{_str(user.get('id'))}:{_str(action.get('action_id'))}:{when}"


def _str(value: JSONValue) -> str:
    return value if isinstance(value, str) else ""


@dataclass(frozen=True)
class SlackMessage:
    """A user's message: where (``channel``, its ``thread_ts`` when in a thread), who, what,
    and its ``ts`` (the message's id in its channel)."""

    channel: str
    channel_type: str
    user: str
    text: str
    ts: str
    thread_ts: str | None

    @property
    def source(self) -> SessionSource:
        kind = "dm" if self.channel_type == "im" else "channel"
        return SessionSource(
            platform=Platform.SLACK,
            chat_id=self.channel,
            chat_type="thread" if self.thread_ts else kind,
            user_id=self.user,
            thread_id=self.thread_ts,
        )


def message_of(envelope: JSONObject) -> SlackMessage | None:
    """The user's message an ``event_callback`` body carries; None for anything else."""
    event = envelope.get("event")
    if not isinstance(event, dict) or event.get("type") not in ("message", "app_mention"):
        return None
    if event.get("bot_id") or _str(event.get("subtype")) not in _USER_SUBTYPES:
        return None
    channel, user, ts = _str(event.get("channel")), _str(event.get("user")), _str(event.get("ts"))
    text = _str(event.get("text"))
    if event.get("type") == "app_mention":
        text = _MENTION.sub("", text, count=1)
    text = text.strip()
    if not (channel and user and ts and text):
        return None
    thread_ts = _str(event.get("thread_ts")) or None
    channel_type = _str(event.get("channel_type")) or ("im" if channel.startswith("D") else "")
    return SlackMessage(channel, channel_type, user, text, ts, thread_ts)


def slack_session_id(source: SessionSource) -> str:
    """The session of a chat: its routing key, when that is a valid session id."""
    key = build_session_key(source)
    if not is_valid_session_id(key):
        key = "slack_" + hashlib.sha256(key.encode()).hexdigest()[:32]
    return key


@dataclass(frozen=True)
class Press:
    """A press on an approval's button: the press, and the question's message (its channel,
    ``ts`` and thread) that the verdict replaces."""

    press: ApprovalPress
    channel: str
    message_ts: str
    thread_ts: str | None


def press_of(payload: JSONObject) -> Press | None:
    """The approval press a ``block_actions`` payload is; None for anything else."""
    if payload.get("type") != "block_actions":
        return None
    actions, user = payload.get("actions"), payload.get("user")
    channel, message = payload.get("channel"), payload.get("message")
    if not (isinstance(actions, list) and actions and isinstance(actions[0], dict)):
        return None
    if not (isinstance(user, dict) and isinstance(channel, dict) and isinstance(message, dict)):
        return None
    action = actions[0]
    action_id, approval_id = _str(action.get("action_id")), _str(action.get("value"))
    user_id, channel_id = _str(user.get("id")), _str(channel.get("id"))
    ts = _str(message.get("ts"))
    if action_id not in (APPROVE_ACTION, DENY_ACTION) or not (
        approval_id and user_id and channel_id and ts
    ):
        return None
    press = ApprovalPress(approval_id, action_id == APPROVE_ACTION, user_id, channel_id)
    return Press(press, channel_id, ts, _str(message.get("thread_ts")) or None)


@dataclass(frozen=True)
class SlackCommand:
    """A slash command (``/reveille new``): who typed it, where (a channel or a direct
    message; Slack says no thread), and its first word (``new``, ``help``, ``timers``...)."""

    user: str
    channel: str
    word: str

    @property
    def source(self) -> SessionSource:
        return SlackMessage(self.channel, "", self.user, self.word, "", None).source


def command_of(payload: JSONObject) -> SlackCommand | None:
    """The slash command a ``slash_commands`` payload (or a command's form fields) is."""
    user, channel = _str(payload.get("user_id")), _str(payload.get("channel_id"))
    if not (user and channel and _str(payload.get("command"))):
        return None
    words = _str(payload.get("text")).split()
    return SlackCommand(user, channel, words[0].lower().lstrip("/") if words else "help")
