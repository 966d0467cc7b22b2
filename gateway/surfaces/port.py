"""The surface port: the one small protocol a chat platform (Telegram, Discord, ...) implements.

Everything a chat platform does differently lives behind this port: how a message arrives, how
markdown is written so the platform's parser cannot break, where a message must be split, how
a reply is edited while it streams, how an approval's buttons look and who pressed them, and
how the platform says "blocked", "chat deleted" or "slow down". Everything that is the same on
every platform lives ONCE above it (``gateway.surfaces.chat``): running the turn for a message
(answered once, by an idempotency key and the durable reply records), streaming the reply
into it, and the wake-up rules (combined results, the approvals gate, a busy chat is a wait and
not an attempt, refusals that were not the delivery's fault refunded, a gone chat dropped).

A platform is a package under ``gateway/surfaces/<name>/`` whose adapter subclasses
``gateway.adapter.BasePlatformAdapter`` and satisfies ``ChatSurface``; the composition
root adds it with one line. The adapter reports every platform failure as a ``SurfaceError``
whose ``kind`` says what the layer above must do with it (see ``Refusal``).

Methods of ``ChatSurface`` (all coroutines raise ``SurfaceError`` for platform failures):

* ``start()`` / ``stop(*, grace_seconds=...)``: connect and begin receiving; stop receiving,
  give work in flight ``grace_seconds`` to finish, disconnect. One signature on every surface.
* receiving: the adapter turns what arrives into a ``MessageEvent`` (``source`` = the chat's
  ``SessionSource``, ``session_id`` = the session the chat talks to now, ``message_id`` = the
  platform's id of the message) and hands it to ``ChatTurns.answer_message(event, key=...)``
  with a key that names the platform's message once (the key is what makes a redelivered or
  re-taken message answered once).
* ``limits``: ``SurfaceLimits`` of the platform (message size, whether a sent message may be
  edited, how often).
* ``split(text)``: the pieces (each within ``limits.max_message_chars`` once sent) a reply is
  sent as; on paragraph boundaries where possible.
* ``send_text(to, text, *, edit=None)``: send ONE piece, as ``split`` made it, to the chat
  ``to`` (or, with ``edit``, replace the text of the message with that id); returns the
  message id. The adapter formats it for the platform's parser so that no model output can
  break it (and falls back to plain text if the platform still refuses to parse it), in
  ``split`` already where the platform's measure of a piece is its formatted text (Slack's
  escaped mrkdwn); "not modified" is a success.
* ``typing(to)``: show that a reply is being written (best effort; never raises).
* ``ask_approval(approval)``: ask the owner of the approval's conversation with buttons
  (approve once / deny) carrying the approval's opaque id only. The adapter takes the press,
  and decides it through ``gateway.approvals`` only when ``owner_of`` the chat is the presser
  (``is_owner``); anyone else is told it is not theirs.
* ``owner_of(source)``: the user id who owns the conversation whose stored source is
  ``source`` (a direct chat: its user; a group: the user who started the session), or None
  when unknown. A press on an approval's button becomes an ``ApprovalPress``, decided by
  ``gateway.surfaces.approval_press.decide_press`` (the owner rule, once for every
  platform), whose ``PressAnswer`` the adapter shows (a short answer to the presser, and the
  text the question's message becomes).
* ``send(chat_id, text, *, metadata=None)`` (``BasePlatformAdapter``'s, for a plain push):
  ``SplitSend`` writes it once for every platform: the text ``split`` and each piece sent by
  ``send_text`` to the chat (and ``metadata["thread_id"]``, when given), a failure returned
  as a failed ``SendResult``.
* ``handle_message(event)`` (from ``BasePlatformAdapter``): deliver a wake-up, an internal
  ``MessageEvent`` built by ``gateway.wake.deliver_wake``; the adapter's handler is
  ``ChatTurns.wake``, which applies the wake-up rules for every platform.

Rate limits: a ``SurfaceError`` of kind ``RATE_LIMITED`` carries the platform's
``Retry-After`` in seconds; the layer above waits that long before trying again (a user's
message) or waits and releases its claim retryably (a wake-up). A blocked bot or a deleted
chat is ``GONE``: the message is dropped and logged with the platform's reason; a wake-up to
it is dropped in the ledger with that reason (``SessionGone``), its result kept.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, runtime_checkable

from gateway.adapter import MessageEvent, SendResult
from gateway.approvals import ApprovalRecord
from gateway.config import Platform
from gateway.session import SessionSource

__all__ = [
    "ApprovalPress",
    "ChatSurface",
    "MessageHandler",
    "PressAnswer",
    "Refusal",
    "ReplyRecords",
    "SplitSend",
    "SurfaceError",
    "SurfaceLimits",
    "is_owner",
]

MessageHandler = Callable[[MessageEvent], Awaitable[str | None]]


class Refusal(StrEnum):
    """What a platform's failure means for the layer above."""

    # The chat is gone for this bot for good (blocked, kicked, deleted, unknown channel,
    # missing permissions): drop what was meant for it, with the platform's reason.
    GONE = "gone"
    # Too many requests: wait ``retry_after`` seconds, then try again.
    RATE_LIMITED = "rate_limited"
    # The platform is unreachable or failing (5xx, connection): a later try may succeed.
    TRANSIENT = "transient"
    # The platform refused this request for good (a bad request): do not repeat it.
    REFUSED = "refused"


class SurfaceError(Exception):
    """A platform call that failed, classified by ``kind``. ``reason`` is the platform's own
    words (logged, and the reason a dropped delivery is dropped with); ``code`` its error
    code (HTTP status or the platform's own), when it gave one."""

    def __init__(
        self,
        reason: str,
        *,
        kind: Refusal,
        retry_after: float | None = None,
        code: int | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind
        self.retry_after = retry_after
        self.code = code

    @property
    def gone(self) -> bool:
        return self.kind is Refusal.GONE

    @property
    def transient(self) -> bool:
        """A later try may succeed (rate limited or the platform failing)."""
        return self.kind in (Refusal.RATE_LIMITED, Refusal.TRANSIENT)


@dataclass(frozen=True)
class SurfaceLimits:
    """What the layer above must respect when it sends to the platform.

    ``max_message_chars``: the longest message (in the platform's own measure, which
    ``split`` applies). ``can_edit``: a sent message's text may be replaced, so a reply
    streams into its first message. ``edit_interval``: at most one edit per this many
    seconds while streaming."""

    max_message_chars: int
    can_edit: bool = True
    edit_interval: float = 1.5


@dataclass(frozen=True)
class ApprovalPress:
    """A press on an approval's button: which approval, approve or deny, who pressed it
    (the platform's user id, as ``SessionSource.user_id`` spells it) and in which chat."""

    approval_id: str
    approve: bool
    user_id: str
    chat_id: str


@dataclass(frozen=True)
class PressAnswer:
    """What a press comes to: ``answer``, shown to the presser only (a toast, an ephemeral
    reply); ``verdict``, markdown the question's message becomes (its buttons removed), or
    None to leave the question as it is (a press that decided nothing)."""

    answer: str
    verdict: str | None = None


class ReplyRecords(Protocol):
    """The durable records that make a reply sent once (the platform's state in the store):
    which pieces of the reply under ``key`` were sent as which message, and whether it was
    finished. A re-run of the same key edits the pieces already sent instead of sending
    them again, and a finished key is not answered again."""

    def reply_finished(self, key: str) -> bool: ...

    def reply_parts(self, key: str) -> dict[int, int]: ...

    def record_part(self, key: str, part: int, chat_id: str, message_id: int) -> None: ...

    def finish_reply(self, key: str) -> None: ...


@runtime_checkable
class ChatSurface(Protocol):
    """A chat platform's adapter, as the layer above uses it (see the module docstring)."""

    platform: Platform
    limits: SurfaceLimits

    async def start(self) -> None: ...

    async def stop(self, *, grace_seconds: float = 10.0) -> None: ...

    def set_message_handler(self, handler: MessageHandler) -> None: ...

    async def handle_message(self, event: MessageEvent) -> str | None: ...

    def split(self, text: str) -> list[str]: ...

    async def send_text(self, to: SessionSource, text: str, *, edit: int | None = None) -> int: ...

    async def typing(self, to: SessionSource) -> None: ...

    async def ask_approval(self, approval: ApprovalRecord) -> None: ...

    def owner_of(self, source: SessionSource) -> str | None: ...


def is_owner(surface: ChatSurface, source: SessionSource, user_id: str | None) -> bool:
    """Whether ``user_id`` may answer an approval asked in the chat of ``source``: only the
    conversation's owner, never anyone else in a group and never an unknown presser."""
    if not user_id:
        return False
    owner = surface.owner_of(source)
    return owner is not None and owner == str(user_id)


class SplitSend:
    """The ``send`` of ``BasePlatformAdapter`` for a chat surface (mixed in before it): the
    text split by the surface and each piece sent with ``send_text``, in the chat and (with
    ``metadata["thread_id"]``) the thread; a platform failure is a failed ``SendResult``
    (retryable when the failure is transient), never an exception."""

    async def send(
        self: ChatSurface,
        chat_id: str,
        text: str,
        *,
        metadata: Mapping[str, object] | None = None,
    ) -> SendResult:
        thread = (metadata or {}).get("thread_id")
        to = SessionSource(
            platform=self.platform,
            chat_id=chat_id,
            thread_id=str(thread) if isinstance(thread, str | int) and thread != "" else None,
        )
        last: int | None = None
        try:
            for piece in self.split(text):
                last = await self.send_text(to, piece)
        except SurfaceError as exc:
            return SendResult(success=False, error=str(exc), retryable=exc.transient)
        return SendResult(success=True, message_id=str(last) if last is not None else None)
