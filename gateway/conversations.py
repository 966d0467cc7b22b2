"""API conversations (``/v1/conversations``): a conversation IS an API session.

Its id (``conv_`` + 128 random bits) is the session's id, so the mapping is the store's
own row on every backend, and everything a session has a conversation has too: its turns
(``conversation`` on ``POST /v1/responses`` runs the turn in it), the background results
that come home to it (folded into its next turn exactly once, or a wake-up turn), its
compaction. Its ``metadata`` is the session's (``SessionStore.aset_metadata``).

Its items are the session's transcript messages, each named ``msg_<row id>``: adding
items appends messages (the model sees them on the conversation's next turn), deleting
one marks its row superseded (``deleted``): kept in the store, no longer listed nor sent
to the model. Who may see a conversation is the surface's (its owner key is the
session source's ``user_id``, as for a response's session).
"""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import Mapping, Sequence
from typing import Literal, NotRequired, TypedDict

from agent.messages import ChatMessage
from delivery.session_backend import MessageRecord
from gateway.config import Platform
from gateway.session import SessionGone, SessionRecord, SessionSource, SessionStore
from gateway.turns.conversation import message_text

__all__ = [
    "ConversationItem",
    "ConversationObject",
    "Conversations",
    "is_conversation_id",
    "item_of",
    "new_conversation_id",
]

_ID = re.compile(r"conv_[0-9a-f]{32}")
_ITEM_ID = re.compile(r"msg_([1-9][0-9]{0,17})")
_ROLES = ("user", "assistant", "system", "developer", "tool")


def new_conversation_id() -> str:
    return "conv_" + secrets.token_hex(16)


def is_conversation_id(value: object) -> bool:
    return isinstance(value, str) and _ID.fullmatch(value) is not None


class ItemPart(TypedDict):
    """A text part of an item: ``input_text``, or ``output_text`` for the assistant's."""

    type: str
    text: str
    annotations: NotRequired[list[object]]
    logprobs: NotRequired[list[object]]


class ConversationItem(TypedDict):
    """A transcript message as a conversation item (the openai ``Message`` shape)."""

    id: str
    type: Literal["message"]
    role: str
    status: Literal["completed"]
    content: list[ItemPart]


class ConversationObject(TypedDict):
    id: str
    object: Literal["conversation"]
    created_at: int
    metadata: dict[str, str]


def item_of(record: MessageRecord) -> ConversationItem:
    role = record.role if record.role in _ROLES else "unknown"
    part: ItemPart = {"type": "input_text", "text": record.content}
    if role == "assistant":
        part = {"type": "output_text", "text": record.content, "annotations": [], "logprobs": []}
    return {
        "id": f"msg_{record.id}",
        "type": "message",
        "role": role,
        "status": "completed",
        "content": [part],
    }


def _listed(record: MessageRecord) -> bool:
    meta = record.display_metadata or {}
    return not (meta.get("superseded") or meta.get("failed"))


class Conversations:
    """Conversations over a ``SessionStore`` (see the module docstring)."""

    def __init__(self, store: SessionStore) -> None:
        self.store = store

    @staticmethod
    def object_of(record: SessionRecord) -> ConversationObject:
        return {
            "id": record.id,
            "object": "conversation",
            "created_at": int(record.created_at),
            "metadata": dict(record.metadata or {}),
        }

    async def create(
        self, owner: str | None, metadata: Mapping[str, str], items: Sequence[ChatMessage]
    ) -> SessionRecord:
        conversation_id = new_conversation_id()
        # One transaction: a crash never leaves a conversation without its metadata or
        # first items visible.
        return await self.store.acreate_session(
            conversation_id,
            source=SessionSource(
                platform=Platform.API_SERVER, chat_id=conversation_id, user_id=owner
            ),
            exclusive=True,
            metadata=metadata,
            messages=[(m["role"], message_text(m)) for m in items],
        )

    async def get(self, conversation_id: str) -> SessionRecord | None:
        if not is_conversation_id(conversation_id):
            return None
        return await asyncio.to_thread(self.store.get_session, conversation_id)

    async def set_metadata(
        self, conversation_id: str, metadata: Mapping[str, str]
    ) -> SessionRecord | None:
        if not await self.store.aset_metadata(conversation_id, metadata):
            return None
        return await self.get(conversation_id)

    async def delete(self, conversation_id: str) -> bool:
        return await asyncio.to_thread(self.store.delete_session, conversation_id)

    async def items(self, conversation_id: str) -> list[ConversationItem]:
        """Every listed item, oldest first (SessionGone for a deleted conversation)."""
        records = await asyncio.to_thread(self.store.messages, conversation_id)
        return [item_of(r) for r in records if _listed(r)]

    async def append(
        self, conversation_id: str, messages: Sequence[ChatMessage]
    ) -> list[ConversationItem]:
        def write() -> list[MessageRecord]:
            return [
                self.store.append_message(conversation_id, m["role"], message_text(m))
                for m in messages
            ]

        return [item_of(r) for r in await asyncio.to_thread(write)]

    async def item(self, conversation_id: str, item_id: str) -> ConversationItem | None:
        try:
            items = await self.items(conversation_id)
        except SessionGone:
            return None
        return next((i for i in items if i["id"] == item_id), None)

    async def remove_item(self, conversation_id: str, item_id: str) -> bool:
        """Mark the item's message superseded (``deleted``); False when it is not listed."""
        found = _ITEM_ID.fullmatch(item_id)
        if found is None or await self.item(conversation_id, item_id) is None:
            return False
        marked = await self.store.asupersede(conversation_id, [int(found.group(1))], "deleted")
        return marked > 0
