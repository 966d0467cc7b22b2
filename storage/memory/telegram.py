"""The Telegram state in this process's memory (``delivery.telegram_backend``): for tests and
embedding, where no other server shares it. Every operation runs under one lock, which makes
each take, claim and lease as atomic as a SQL transaction."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from delivery.telegram_backend import InboxUpdate, PollLease, TelegramDump

if TYPE_CHECKING:
    from delivery.telegram_backend import TelegramBackend

__all__ = ["MemoryTelegram"]


@dataclass(slots=True)
class _Row:
    payload: str
    received_at: float
    answered_at: float | None = None
    holder: str | None = None
    claimed_until: float = 0.0


class MemoryTelegram:
    """``TelegramBackend`` in memory (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._offsets: dict[str, int] = {}
        self._inbox: dict[tuple[str, int], _Row] = {}
        self._leases: dict[str, PollLease] = {}
        self._parts: dict[str, dict[int, tuple[str, int]]] = {}
        self._done: dict[str, float] = {}
        self._chats: dict[str, str] = {}
        self._values: dict[str, tuple[str, float | None]] = {}  # name -> (value, written_at)

    def close(self) -> None:
        pass

    def _move(self, bot: str, nxt: int) -> None:
        self._offsets[bot] = max(self._offsets.get(bot, nxt), nxt)

    def next_offset(self, bot: str) -> int | None:
        with self._lock:
            return self._offsets.get(bot)

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
        fresh: list[int] = []
        with self._lock:
            for update_id, payload in updates:
                if (bot, int(update_id)) not in self._inbox:
                    row = _Row(payload, now, holder=holder, claimed_until=now + claim_seconds)
                    self._inbox[(bot, int(update_id))] = row
                    fresh.append(int(update_id))
            if move_offset and updates:
                self._move(bot, max(int(u) for u, _ in updates) + 1)
        return fresh

    def unanswered(self, bot: str) -> list[InboxUpdate]:
        with self._lock:
            return [
                InboxUpdate(uid, row.payload, row.holder, row.claimed_until)
                for (b, uid), row in sorted(self._inbox.items())
                if b == bot and row.answered_at is None
            ]

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
        with self._lock:
            row = self._inbox.get((bot, int(update_id)))
            if row is None or row.answered_at is not None:
                return False
            held = row.holder is not None and row.claimed_until > now
            if held and row.holder not in (holder, dead_holder):
                return False
            row.holder, row.claimed_until = holder, now + claim_seconds
            return True

    def renew_claims(self, bot: str, holder: str, *, now: float, claim_seconds: float) -> int:
        with self._lock:
            mine = [
                row
                for (b, _), row in self._inbox.items()
                if b == bot and row.holder == holder and row.answered_at is None
            ]
            for row in mine:
                row.claimed_until = now + claim_seconds
            return len(mine)

    def mark_answered(self, bot: str, update_id: int, *, now: float) -> None:
        with self._lock:
            row = self._inbox.get((bot, int(update_id)))
            if row is not None and row.answered_at is None:
                row.answered_at, row.holder = now, None

    def poll_lease(self, bot: str) -> PollLease | None:
        with self._lock:
            return self._leases.get(bot)

    def take_poll_lease(
        self,
        bot: str,
        holder: str,
        *,
        now: float,
        ttl_seconds: float,
        dead_holder: str | None = None,
    ) -> bool:
        with self._lock:
            lease = self._leases.get(bot)
            if (
                lease is not None
                and lease.expires_at > now
                and lease.holder not in (holder, dead_holder)
            ):
                return False
            self._leases[bot] = PollLease(holder, now + ttl_seconds)
            return True

    def release_poll_lease(self, bot: str, holder: str) -> None:
        with self._lock:
            lease = self._leases.get(bot)
            if lease is not None and lease.holder == holder:
                del self._leases[bot]

    def reply_parts(self, key: str) -> dict[int, int]:
        with self._lock:
            return {part: mid for part, (_, mid) in self._parts.get(key, {}).items()}

    def record_part(self, key: str, part: int, chat_id: str, message_id: int) -> None:
        with self._lock:
            self._parts.setdefault(key, {})[int(part)] = (chat_id, int(message_id))

    def reply_finished(self, key: str) -> bool:
        with self._lock:
            return key in self._done

    def finish_reply(self, key: str, *, now: float) -> None:
        with self._lock:
            self._done.setdefault(key, now)

    def chat_session(self, chat_key: str) -> str | None:
        with self._lock:
            return self._chats.get(chat_key)

    def start_chat_session(self, chat_key: str, session_id: str, *, now: float) -> None:
        with self._lock:
            self._chats[chat_key] = session_id

    def platform_value(self, name: str) -> str | None:
        with self._lock:
            found = self._values.get(name)
            return None if found is None else found[0]

    def set_platform_value(self, name: str, value: str, *, written_at: float | None = None) -> None:
        with self._lock:
            self._values[name] = (value, written_at)

    def prune(self, before: float) -> None:
        with self._lock:
            for update in [
                k
                for k, row in self._inbox.items()
                if row.answered_at is not None and row.answered_at < before
            ]:
                del self._inbox[update]
            for reply in [k for k, at in self._done.items() if at < before]:
                del self._done[reply]
                self._parts.pop(reply, None)
            for name in [
                k for k, (_, at) in self._values.items() if at is not None and at < before
            ]:
                del self._values[name]

    def absorb(self, dump: TelegramDump) -> None:
        with self._lock:
            for bot, nxt in dump.offsets.items():
                self._move(bot, int(nxt))
            for u in dump.inbox:
                self._inbox.setdefault(
                    (u.bot, u.update_id), _Row(u.payload_json, u.received_at, u.answered_at)
                )
            for p in dump.parts:
                self._parts.setdefault(p.reply_key, {}).setdefault(
                    p.part, (p.chat_id, p.message_id)
                )
            for d in dump.done:
                self._done.setdefault(d.reply_key, d.done_at)
            for c in dump.chats:
                self._chats.setdefault(c.chat_key, c.session_id)


if TYPE_CHECKING:
    _conforms: type[TelegramBackend] = MemoryTelegram
