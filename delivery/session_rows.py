"""The session store's row-level port: what each dialect implements, and nothing more.

``delivery.session_rules`` writes the session store's rules once, against two small
interfaces every backend provides:

* ``SessionRows``: the rows of one open transaction (sessions, tombstones, messages,
  idempotency records, turn leases, approvals). Each method reads or writes rows and keeps
  no rule of its own beyond what a row is: it never checks a session is live, never folds
  on its own, never decides who holds a lease. A method never commits.
* ``SessionTx``: how a backend runs an operation as one transaction on its rows: ``write``
  (atomic: an operation that raises has written nothing), ``read`` (one consistent
  snapshot), each with a coroutine twin that never blocks the event loop. ``locks`` name
  what a write serialises on across processes, taken in order (a session id,
  ``turn:<id>``, ``idem:<key>``, ``approval:<id>``): a backend whose writes are
  serialised anyway (one SQLite writer, one lock in memory) ignores them.

SQLite and PostgreSQL share one implementation of ``SessionRows`` (``storage.session_sql``);
the memory backend has its own over dictionaries.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

from delivery.session_backend import (
    ApprovalRecord,
    ApprovalStatus,
    IdempotencyRecord,
    MessageHit,
    MessageRecord,
    NewMessage,
    NewSession,
    SessionRecord,
    SessionState,
    TurnLease,
)

__all__ = ["SessionRows", "SessionTx"]

T = TypeVar("T")


class SessionRows(Protocol):
    """The rows of one open transaction of a session store."""

    # -- sessions and tombstones
    def live(self, session_id: str) -> bool:
        """Whether a session row with this id exists (cheaper than reading it)."""

    def session(self, session_id: str) -> SessionRecord | None: ...

    def tombstoned(self, session_id: str) -> bool: ...

    def state(self, session_id: str) -> SessionState:
        """``live`` (a session row), ``deleted`` (none, but a tombstone) or ``unknown``: what
        ``live`` then ``tombstoned`` answer, asked in one statement (one trip, not two)."""

    def insert_session(self, session_id: str, new: NewSession, now: float) -> None:
        """Insert the session row unless one with that id exists. Nothing is read back, so a
        backend may send it without waiting (PostgreSQL's pipeline): the rule checks
        ``live`` first, under the session's lock, where it needs to know."""

    def insert_new_session(self, session_id: str, new: NewSession, now: float) -> bool:
        """Insert the session row when neither a session nor a tombstone has its id, in one
        statement that also answers whether it did: a new conversation's first write then
        needs no ``state`` read. A backend may decline and answer False with nothing written
        (PostgreSQL: its batches send each operation's first read ahead, and ``state`` is
        that read); the rule then reads the state and decides as before."""

    def delete_session(self, session_id: str) -> bool:
        """Delete the session row and its messages; True when there was one."""

    def tombstone(self, session_id: str, now: float) -> None: ...

    def untombstone(self, session_id: str) -> None: ...

    def touch(self, session_id: str, now: float) -> None:
        """Set ``updated_at`` (nothing when there is no such session); nothing is read back,
        so a backend may send it without waiting."""

    def sessions(self, limit: int, offset: int) -> list[SessionRecord]:
        """Newest activity first (``updated_at`` descending, then id)."""

    def session_by_key(self, session_key: str) -> SessionRecord | None:
        """The most recently active session with this routing key."""

    def prefix_ids(self, prefix: str, limit: int) -> tuple[list[str], bool]:
        """Ids equal to ``prefix`` or starting with ``prefix + "_"``, oldest session first;
        and whether ``prefix`` itself is tombstoned (asked in the same statement: one trip)."""

    def set_title(self, session_id: str, title: str, *, if_untitled: bool) -> bool: ...

    def set_system_prompt(self, session_id: str, prompt: str | None) -> bool: ...

    def set_metadata(self, session_id: str, metadata_json: str | None) -> bool: ...

    # -- messages
    def insert_message(self, session_id: str, message: NewMessage, now: float) -> MessageRecord:
        """Insert one row, or return the row of the session its dedupe key already names."""

    def insert_messages(self, session_id: str, messages: Sequence[NewMessage], now: float) -> None:
        """Insert rows without reading them back (a repeated dedupe key is skipped)."""

    def messages_after(
        self, session_id: str, after_id: int, limit: int | None
    ) -> list[MessageRecord]:
        """Rows with ids > ``after_id``, in order."""

    def messages_before(self, session_id: str, before_id: int, limit: int) -> list[MessageRecord]:
        """The ``limit`` newest rows with ids < ``before_id``, in order."""

    def transcript(self, session_id: str, *, live: bool) -> list[MessageRecord]:
        """Every row in order (``live``: less the rows a compaction archived)."""

    def messages_by_id(self, session_id: str, ids: Sequence[int]) -> list[MessageRecord]:
        """The session's rows among ``ids`` (any order)."""

    def fold(self, session_id: str, upto: int, now: float) -> list[MessageRecord]:
        """Mark folded the delivery rows with ids <= ``upto`` no turn folded yet; those rows
        (as they are now), in order."""

    def mark_seen(self, session_id: str, ids: Sequence[int], now: float) -> None:
        """Set ``seen_at`` on the folded rows among ``ids`` that have none."""

    def archive(self, session_id: str, ids: Sequence[int], summary_id: int, now: float) -> None:
        """Set ``archived_at`` and ``summary_id`` on the session's rows among ``ids``."""

    def supersede(self, session_id: str, ids: Sequence[int], how: str) -> int:
        """Set ``display_metadata["superseded"] = how`` on the non-delivery rows among
        ``ids``; how many."""

    def search(self, terms: Sequence[str], limit: int) -> list[MessageHit]:
        """The newest ``limit`` rows in which every term starts a word, newest first."""

    def unfolded_by_dedupe(self, wanted: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        """The (session id, dedupe key) pairs naming a delivery row not folded yet."""

    def old_archived(self, before: float, limit: int) -> list[int]:
        """Ids of at most ``limit`` rows archived before ``before``, oldest first, that are
        not unfolded delivery rows."""

    def delete_messages(self, ids: Sequence[int]) -> int: ...

    # -- idempotency records
    def idempotency(self, key: str) -> IdempotencyRecord | None: ...

    def claim_idempotency(self, key: str, owner: str, session_id: str | None, now: float) -> None:
        """Make the record ``running`` for ``owner`` (inserted, or overwritten but for its
        ``created_at`` and ``response``)."""

    def finish_idempotency(
        self, key: str, session_id: str, response_json: str | None, now: float
    ) -> None:
        """Make the record ``done`` with this response (inserted, or overwritten but for
        its ``created_at``)."""

    def delete_idempotency(self, key: str) -> None: ...

    def old_idempotency(self, before: float, limit: int) -> list[str]:
        """Keys of at most ``limit`` ``done`` records last written before ``before``."""

    def forget_idempotency(self, keys: Sequence[str]) -> int:
        """Delete the ``done`` records among ``keys``; how many."""

    def old_tombstones(self, before: float, limit: int) -> list[str]: ...

    def forget_tombstones(self, ids: Sequence[str]) -> int: ...

    # -- turn leases
    def lease(self, session_id: str) -> TurnLease | None: ...

    def put_lease(self, lease: TurnLease) -> None:
        """Insert the lease, or replace the session's."""

    def extend_lease(self, session_id: str, stream_id: str, expires_at: float) -> bool: ...

    def drop_lease(self, session_id: str, stream_id: str) -> bool: ...

    def leases(self, alive_at: float) -> list[TurnLease]:
        """The leases whose ``expires_at`` is after ``alive_at``."""

    # -- approvals
    def approval(self, approval_id: str) -> ApprovalRecord | None: ...

    def insert_approval(self, approval: ApprovalRecord) -> None: ...

    def settle_approval(self, approval_id: str, status: ApprovalStatus, answer: str = "") -> bool:
        """Set the status (and a form's ``answer``) of a pending approval; False when it was
        not pending."""

    def deny_pending(self, session_id: str, stream_id: str) -> None:
        """Deny every pending approval the turn ``stream_id`` of the session asked."""

    def forget_decided(self, before: float) -> None:
        """Delete the approvals that are not pending and were created before ``before``."""

    def pending_of(self, session_id: str, stream_id: str) -> ApprovalRecord | None: ...

    def pending_units(self) -> list[ApprovalRecord]:
        """Pending approvals of background units, oldest first."""

    def approval_counts(self) -> dict[str, int]: ...


class SessionTx(Protocol):
    """How a backend runs an operation on its rows as one transaction."""

    @property
    def url(self) -> str: ...

    def write(self, locks: tuple[str, ...], op: Callable[[SessionRows], T]) -> T: ...

    def awrite(self, locks: tuple[str, ...], op: Callable[[SessionRows], T]) -> Awaitable[T]: ...

    def read(self, op: Callable[[SessionRows], T]) -> T: ...

    def aread(self, op: Callable[[SessionRows], T]) -> Awaitable[T]: ...

    def stats(self) -> dict[str, int]:
        """Counters; ``writes`` counts committed write operations."""

    def close(self) -> None:
        """Idempotent; any later call raises SessionStoreError."""
