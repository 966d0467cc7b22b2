"""What a Matrix ``/sync`` answer holds for the bot, as typed records (``parse_sync``).

Only what the adapter acts on is read: text messages of other users in joined rooms, their
reactions (an approval's answer), invites (with who sent them, and whether the inviter
marked the room direct), rooms that are encrypted (the bot cannot read them and says so),
and each joined room's member count (two members: a direct chat). Edits of messages
(``m.replace``) are not new messages and are skipped, as is everything the bot sent itself.
Anything malformed is skipped, never raised: the answer came from a server, not from us.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.config import Platform
from gateway.session import SessionSource, build_session_key, is_valid_session_id

__all__ = [
    "Invite",
    "Reaction",
    "RoomMessage",
    "SyncBatch",
    "matrix_session_id",
    "parse_sync",
]

Json = Mapping[str, object]
_TEXT_TYPES = frozenset({"m.text", "m.emote", "m.notice"})


@dataclass(frozen=True)
class RoomMessage:
    room_id: str
    event_id: str
    sender: str
    text: str
    at: float = 0.0  # when the homeserver took it (epoch seconds)


@dataclass(frozen=True)
class Reaction:
    room_id: str
    event_id: str
    sender: str
    target: str  # the event reacted to
    key: str


@dataclass(frozen=True)
class Invite:
    room_id: str
    sender: str
    direct: bool
    encrypted: bool = False  # the room is encrypted: told so once joined


@dataclass
class SyncBatch:
    next_batch: str
    messages: list[RoomMessage] = field(default_factory=list)
    reactions: list[Reaction] = field(default_factory=list)
    invites: list[Invite] = field(default_factory=list)
    encrypted: set[str] = field(default_factory=set)
    members: dict[str, int] = field(default_factory=dict)


def _obj(value: object) -> Json:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[object]:
    return list(value) if isinstance(value, list) else []


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _events(room: Json, section: str) -> list[Json]:
    return [_obj(e) for e in _list(_obj(room.get(section)).get("events"))]


def _take_event(batch: SyncBatch, room_id: str, event: Json, me: str) -> None:
    kind, sender = _str(event.get("type")), _str(event.get("sender"))
    if kind == "m.room.encryption" or kind == "m.room.encrypted":
        batch.encrypted.add(room_id)
        return
    if not sender or sender == me or "state_key" in event:
        return
    content = _obj(event.get("content"))
    relates = _obj(content.get("m.relates_to"))
    event_id = _str(event.get("event_id"))
    if kind == "m.reaction":
        if relates.get("rel_type") == "m.annotation" and relates.get("event_id"):
            batch.reactions.append(
                Reaction(
                    room_id, event_id, sender, _str(relates["event_id"]), _str(relates.get("key"))
                )
            )
        return
    if kind != "m.room.message" or content.get("msgtype") not in _TEXT_TYPES:
        return
    if relates.get("rel_type") == "m.replace":
        return
    text = _str(content.get("body")).strip()
    ts = event.get("origin_server_ts")
    at = float(ts) / 1000.0 if isinstance(ts, int | float) else 0.0
    if text and event_id:
        batch.messages.append(RoomMessage(room_id, event_id, sender, text, at))


def parse_sync(data: Json, me: str) -> SyncBatch:
    """The records of one ``/sync`` answer, in the order the server gave them."""
    batch = SyncBatch(next_batch=_str(data.get("next_batch")))
    rooms = _obj(data.get("rooms"))
    for room_id, room in _obj(rooms.get("join")).items():
        room = _obj(room)
        count = _obj(room.get("summary")).get("m.joined_member_count")
        if isinstance(count, int):
            batch.members[room_id] = count
        for event in _events(room, "state"):
            _take_event(batch, room_id, event, me)
        for event in _events(room, "timeline"):
            _take_event(batch, room_id, event, me)
    for room_id, room in _obj(rooms.get("invite")).items():
        state = _events(_obj(room), "invite_state")
        encrypted = any(e.get("type") == "m.room.encryption" for e in state)
        for event in state:
            content = _obj(event.get("content"))
            if (
                event.get("type") == "m.room.member"
                and event.get("state_key") == me
                and content.get("membership") == "invite"
            ):
                direct = content.get("is_direct") is True
                batch.invites.append(Invite(room_id, _str(event.get("sender")), direct, encrypted))
    return batch


def matrix_session_id(source: SessionSource) -> str:
    """The session of a room: its routing key, hashed when it is no valid session id (room
    ids hold ``!`` and ``:``)."""
    key = build_session_key(source)
    if not is_valid_session_id(key):
        key = "matrix_" + hashlib.sha256(key.encode()).hexdigest()[:32]
    return key


def room_source(room_id: str, sender: str, members: int | None) -> SessionSource:
    """The chat of a message: a room of two is a direct chat, a larger one a group."""
    kind = "dm" if members is None or members <= 2 else "group"
    return SessionSource(
        platform=Platform.MATRIX, chat_id=room_id, chat_type=kind, user_id=sender, user_name=sender
    )
