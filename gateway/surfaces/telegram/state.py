"""The Telegram adapter's durable state, as the adapter uses it: a thin face over the store's
``delivery.telegram_backend.TelegramBackend`` (opened by ``storage.open_storage(url)
.open_telegram()``: ``chats.db`` beside the ledger, or the PostgreSQL database), shared by
every server that serves the same bot.

* Intake. ``take_updates`` stores the updates a ``getUpdates`` call returned, claimed by this
  server, and moves the offset past them in ONE transaction: from then on they are ours (the
  next ``getUpdates`` confirms them to Telegram) and live in the inbox until answered. After a
  crash the inbox still holds every update that was not answered, and the offset never points
  before one that was taken: no update is lost, and none is taken twice. Webhook updates go
  into the same inbox (keyed by update id, so a webhook retry of the same update, at whichever
  server it arrives, is handed out once).
* Claims. Each unanswered update is held by the server answering it, renewed while it lives
  (``renew``). ``claim_orphans`` takes the ones whose holder is gone (a process of this host
  that exited, or a claim that lapsed) and hands them out again: a server killed mid-answer
  loses its updates to the next start, or to another server within seconds.
* The polling lease. One server at a time polls ``getUpdates`` (two pollers would meet
  Telegram's 409 Conflict): ``hold_poll_lease`` takes or renews it, the others stand by and
  take it over when it lapses or its holder is proved dead.
* Answers. The turn of an update runs under the idempotency key ``telegram:<bot>:update:<id>``
  (the session store's records), so a second run after a crash replays the stored answer
  instead of running the agent again. Each message a reply was sent as is recorded
  (``record_part``) the moment Telegram returns its id; a repeated answer edits those
  messages instead of sending new ones, and ``finish_reply`` marks the reply complete.
* Conversations. ``/new`` starts a fresh session for a chat: ``chat_session`` maps the chat's
  routing key to the session its messages go to now (none: the key itself, the chat's first
  session). Old sessions are never touched.

Synchronous; the adapter calls it through ``asyncio.to_thread``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection

from agent.messages import JSONObject
from delivery.identity import current_identity, holder_is_dead
from delivery.telegram_backend import TelegramBackend
from gateway.surfaces.telegram.updates import update_id_of

__all__ = ["LEASE_SECONDS", "TelegramState"]

# How long a claim or the polling lease lasts unrenewed: a server on another host that dies
# loses them this long after its last renewal (``renew`` runs every third of it).
LEASE_SECONDS = 6.0
# Answered updates and finished replies are kept this long (a webhook may resend one).
_KEEP_SECONDS = 7 * 24 * 3600.0


class TelegramState:
    """See the module docstring; ``holder`` names this server in claims and the lease."""

    def __init__(
        self,
        backend: TelegramBackend,
        *,
        holder: str | None = None,
        lease_seconds: float = LEASE_SECONDS,
    ) -> None:
        self.backend = backend
        self.holder = holder or str(current_identity())
        self.lease_seconds = lease_seconds

    def close(self) -> None:
        self.backend.close()

    # ----------------------------------------------------------------- intake

    def next_offset(self, bot: str) -> int | None:
        return self.backend.next_offset(bot)

    def take_updates(
        self, bot: str, updates: list[JSONObject], *, move_offset: bool = True
    ) -> list[tuple[int, JSONObject]]:
        """Store ``updates`` in the inbox, claimed by this server, and (polling) move the
        offset past them, atomically.

        Returns the updates that were new, in update-id order; ones already taken (a
        repeated webhook call, an update handed out twice, one another server took) are
        left out.
        """
        # An id no update can have (``update_id_of``) is left out: stored, it would fail
        # the whole transaction and so block every later update.
        valid = sorted(
            ((update_id, u) for u in updates if (update_id := update_id_of(u)) is not None),
            key=lambda pair: pair[0],
        )
        fresh = set(
            self.backend.take_updates(
                bot,
                [(uid, json.dumps(u)) for uid, u in valid],
                holder=self.holder,
                now=time.time(),
                claim_seconds=self.lease_seconds,
                move_offset=move_offset,
            )
        )
        return [(uid, u) for uid, u in valid if uid in fresh]

    def claim_orphans(
        self, bot: str, in_hand: Collection[int] = ()
    ) -> list[tuple[int, JSONObject]]:
        """Unanswered updates whose holder is gone (or none), now claimed by this server,
        oldest first. This server's own are left out when ``in_hand`` (being answered);
        one of its own that is not (its intake was cancelled between storing and handing
        it out) is handed out again."""
        taken: list[tuple[int, JSONObject]] = []
        for row in self.backend.unanswered(bot):
            if row.holder == self.holder and row.update_id in in_hand:
                continue
            now = time.time()
            dead = row.holder if holder_is_dead(row.holder) else None
            others = row.holder is not None and row.holder != self.holder
            if others and dead is None and row.claimed_until > now:
                continue  # another live server answers it
            won = self.backend.claim(
                bot,
                row.update_id,
                self.holder,
                now=now,
                claim_seconds=self.lease_seconds,
                dead_holder=dead,
            )
            if won:
                taken.append((row.update_id, json.loads(row.payload_json)))
        return taken

    def renew(self, bot: str) -> None:
        """Keep this server's claims alive."""
        self.backend.renew_claims(
            bot, self.holder, now=time.time(), claim_seconds=self.lease_seconds
        )

    def mark_answered(self, bot: str, update_id: int) -> None:
        self.backend.mark_answered(bot, update_id, now=time.time())

    # ----------------------------------------------------------------- the polling lease

    def hold_poll_lease(self, bot: str) -> bool:
        """Take or renew the polling lease; True while this server holds it."""
        lease = self.backend.poll_lease(bot)
        dead = lease.holder if lease is not None and holder_is_dead(lease.holder) else None
        return self.backend.take_poll_lease(
            bot, self.holder, now=time.time(), ttl_seconds=self.lease_seconds, dead_holder=dead
        )

    def release_poll_lease(self, bot: str) -> None:
        self.backend.release_poll_lease(bot, self.holder)

    # ----------------------------------------------------------------- replies

    def reply_parts(self, key: str) -> dict[int, int]:
        """The messages a reply was already sent as: part index -> message id."""
        return self.backend.reply_parts(key)

    def record_part(self, key: str, part: int, chat_id: str, message_id: int) -> None:
        self.backend.record_part(key, part, chat_id, message_id)

    def reply_finished(self, key: str) -> bool:
        return self.backend.reply_finished(key)

    def finish_reply(self, key: str) -> None:
        self.backend.finish_reply(key, now=time.time())

    # ----------------------------------------------------------------- conversations

    def chat_session(self, chat_key: str) -> str | None:
        """The session a chat's messages go to now, when ``/new`` chose one."""
        return self.backend.chat_session(chat_key)

    def start_chat_session(self, chat_key: str, session_id: str) -> None:
        self.backend.start_chat_session(chat_key, session_id, now=time.time())

    # ----------------------------------------------------------------- housekeeping

    def prune(self, keep_seconds: float = _KEEP_SECONDS) -> None:
        """Forget updates answered and replies finished ``keep_seconds`` ago (at start)."""
        self.backend.prune(time.time() - keep_seconds)
