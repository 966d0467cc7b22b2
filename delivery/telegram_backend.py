"""The storage seam of the Telegram adapter's durable state, shared by every server on one
store: the update inbox, the ``getUpdates`` offset, the polling lease, the sent-reply records
and the chat-to-session map.

``gateway.surfaces.telegram.state.TelegramState`` is the face the adapter uses; it speaks
this protocol to a backend opened by ``storage.open_storage(url).open_telegram()`` (tables
in ``chats.db`` beside the ledger, or in the PostgreSQL database, or memory). The rules
every backend keeps, proved by ``tests/telegram/test_state_backends.py``:

* ``take_updates`` stores new updates (each claimed by the taker) and moves the offset past
  them in ONE transaction; an update already in the inbox is left out of what it returns,
  so each update is handed to one server once, whichever server (poll or webhook) took it.
* The offset only moves forward (two pollers that raced never move it back).
* ``claim`` takes an unanswered update for a holder only when nobody holds it, its claim
  lapsed, the holder is the claimer itself, or it is ``dead_holder`` (a holder the caller
  proved dead): one winner when several servers try at once.
* ``take_poll_lease`` is the same rule for the one polling lease of a bot (a row with
  holder and expiry, as the ledger's ``leases``).
* Replies: parts recorded by index, a finished reply stays finished; chats: the newest
  session ``/new`` chose.

Methods block: callers run them on a thread of their own (``asyncio.to_thread``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

__all__ = [
    "InboxUpdate",
    "PollLease",
    "TelegramBackend",
    "TelegramDump",
    "TelegramDumpChat",
    "TelegramDumpDone",
    "TelegramDumpInbox",
    "TelegramDumpPart",
    "poll_lease_name",
]


def poll_lease_name(bot: str) -> str:
    """The lease row of a bot's ``getUpdates`` loop (in the store's ``leases`` table)."""
    return f"telegram-poll:{bot}"


@dataclass(frozen=True, slots=True)
class InboxUpdate:
    """An update in the inbox, its payload as the JSON text Telegram sent."""

    update_id: int
    payload_json: str
    holder: str | None = None
    """The server answering it now (a ``ProcessIdentity`` string), None when nobody is."""
    claimed_until: float = 0.0


@dataclass(frozen=True, slots=True)
class PollLease:
    """Who polls ``getUpdates`` for a bot, until when (unless renewed)."""

    holder: str
    expires_at: float


@dataclass(frozen=True, slots=True)
class TelegramDumpInbox:
    bot: str
    update_id: int
    payload_json: str
    received_at: float
    answered_at: float | None


@dataclass(frozen=True, slots=True)
class TelegramDumpPart:
    reply_key: str
    part: int
    chat_id: str
    message_id: int


@dataclass(frozen=True, slots=True)
class TelegramDumpDone:
    reply_key: str
    done_at: float


@dataclass(frozen=True, slots=True)
class TelegramDumpChat:
    chat_key: str
    session_id: str
    started_at: float


@dataclass(slots=True)
class TelegramDump:
    """Everything an old ``telegram.db`` held, to be absorbed into the store once."""

    offsets: dict[str, int] = field(default_factory=dict)
    inbox: list[TelegramDumpInbox] = field(default_factory=list)
    parts: list[TelegramDumpPart] = field(default_factory=list)
    done: list[TelegramDumpDone] = field(default_factory=list)
    chats: list[TelegramDumpChat] = field(default_factory=list)


class TelegramBackend(Protocol):
    """The Telegram adapter's shared state (see the module docstring)."""

    # -- intake
    def next_offset(self, bot: str) -> int | None:
        """The offset the next ``getUpdates`` asks with (None: no poll took anything yet)."""

    def take_updates(
        self,
        bot: str,
        updates: list[tuple[int, str]],
        *,
        holder: str,
        now: float,
        claim_seconds: float,
        move_offset: bool = True,
    ) -> list[int]:
        """Store ``(update_id, payload_json)`` pairs not in the inbox yet, claimed by
        ``holder``, and (``move_offset``) move the offset past all of them, atomically; the
        ids that were new, in the order given."""

    def unanswered(self, bot: str) -> list[InboxUpdate]:
        """Updates taken and not answered yet, oldest first."""

    def claim(
        self,
        bot: str,
        update_id: int,
        holder: str,
        *,
        now: float,
        claim_seconds: float,
        dead_holder: str | None = None,
    ) -> bool:
        """Take an unanswered update for ``holder`` (see the module docstring)."""

    def renew_claims(self, bot: str, holder: str, *, now: float, claim_seconds: float) -> int:
        """Extend every unanswered claim of ``holder``; how many."""

    def mark_answered(self, bot: str, update_id: int, *, now: float) -> None: ...

    # -- the polling lease
    def poll_lease(self, bot: str) -> PollLease | None: ...

    def take_poll_lease(
        self,
        bot: str,
        holder: str,
        *,
        now: float,
        ttl_seconds: float,
        dead_holder: str | None = None,
    ) -> bool:
        """Take or renew the lease: free, lapsed, ours or ``dead_holder``'s; True when held."""

    def release_poll_lease(self, bot: str, holder: str) -> None:
        """Give the lease up (a clean stop), if ``holder`` has it."""

    # -- replies
    def reply_parts(self, key: str) -> dict[int, int]:
        """The messages a reply was already sent as: part index -> message id."""

    def record_part(self, key: str, part: int, chat_id: str, message_id: int) -> None: ...

    def reply_finished(self, key: str) -> bool: ...

    def finish_reply(self, key: str, *, now: float) -> None: ...

    # -- conversations
    def chat_session(self, chat_key: str) -> str | None: ...

    def start_chat_session(self, chat_key: str, session_id: str, *, now: float) -> None: ...

    # -- housekeeping
    def platform_value(self, name: str) -> str | None:
        """A chat platform's own small state under ``name`` (Matrix: its ``/sync`` token,
        its device), None when never set."""

    def set_platform_value(self, name: str, value: str, *, written_at: float | None = None) -> None:
        """Set (or replace) the value under ``name``. With ``written_at`` it is forgotten by
        ``prune`` as a finished reply is (Matrix: the event id of a sent message); without,
        it is kept until replaced (a sync token, a device)."""

    def prune(self, before: float) -> None:
        """Forget updates answered, replies finished and values written (``written_at``)
        before ``before``."""

    def absorb(self, dump: TelegramDump) -> None:
        """Add an old file's state, keeping what the store has (a second absorb of the same
        dump changes nothing)."""

    def close(self) -> None: ...
