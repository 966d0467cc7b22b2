"""Sessions: where a conversation came from, how it is routed, and its durable transcript.

* ``SessionSource`` names the origin of a conversation (platform, chat, thread, user) and
  ``build_session_key`` its routing key (both in ``gateway.session_source``, named here too).
* ``SessionStore`` is the face callers use for sessions and their transcripts, including
  the delivery rows that background completions leave in API-server sessions and that the
  next client turn folds into its context exactly once. It validates and encodes, then
  hands typed records to the ``delivery.session_backend.SessionBackend`` it is given
  (``SessionStore(backend)``; the composition root opens one through ``storage``).
"""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from delivery.identity import current_identity, holder_is_dead
from delivery.session_backend import (
    ApprovalRecord,
    Compaction,
    MessageHit,
    MessageRecord,
    NewMessage,
    NewSession,
    PrefixSessions,
    SessionBackend,
    SessionGone,
    SessionRecord,
    SessionState,
    SessionStoreError,
    SessionTaken,
    TurnLease,
    TurnStart,
    encode_json,
    search_terms,
)
from gateway.session_source import SessionSource, build_session_key, chat_session_key

__all__ = [
    "MessageRecord",
    "SessionGone",
    "SessionRecord",
    "SessionSource",
    "SessionState",
    "SessionStore",
    "SessionStoreError",
    "SessionTaken",
    "TurnStart",
    "build_session_key",
    "chat_session_key",
    "is_valid_session_id",
    "new_session_id",
    "title_from_text",
]

_SESSION_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}")


# --------------------------------------------------------------------------- ids

MAX_TITLE_CHARS = 200  # a session's title, in characters
MAX_SYSTEM_PROMPT_CHARS = 20_000  # a chat's own system prompt, in characters

_TITLE_FROM_TEXT_CHARS = 60


def title_from_text(text: str) -> str | None:
    """A session's title from its first message: the first line that has words, spaces
    folded, cut at a word near ``_TITLE_FROM_TEXT_CHARS`` characters; None for blank text."""
    line = ""
    for ln in text.splitlines():  # a loop, not a generator: every new session asks
        if ln.strip():
            line = " ".join(ln.split())
            break
    if len(line) <= _TITLE_FROM_TEXT_CHARS:
        return line or None
    cut = line[: _TITLE_FROM_TEXT_CHARS - 1]
    if " " in cut[_TITLE_FROM_TEXT_CHARS // 2 :]:
        cut = cut[: cut.rindex(" ")]
    return cut.rstrip() + "\u2026"


def is_valid_session_id(s: object) -> bool:
    """True for 1..128 characters of ``[A-Za-z0-9._:-]`` (safe in headers, URLs and logs)."""
    return isinstance(s, str) and _SESSION_ID_RE.fullmatch(s) is not None


def new_session_id() -> str:
    """A fresh, unguessable session id (``sess_`` + 32 hex chars)."""
    return "sess_" + secrets.token_hex(16)


# --------------------------------------------------------------------------- store


def _new_session(
    source: SessionSource | None, title: str | None, exclusive: bool = False
) -> NewSession:
    if source is not None and not isinstance(source, SessionSource):
        raise TypeError(f"source must be a SessionSource, got {type(source).__name__}")
    if source is None:
        return NewSession(title=title, exclusive=exclusive)
    return NewSession(
        source_json=source.to_json(),
        session_key=build_session_key(source),
        title=title,
        exclusive=exclusive,
    )


# How long a running turn holds its session without renewing: a server renews every third
# of it, so a holder that dies on another host frees the session within this.
TURN_LEASE_SECONDS = 15.0
_NO_ID_ABOVE = 2**62  # above every message id: "before" it is "from the end"


def _check_id(session_id: str) -> None:
    if not is_valid_session_id(session_id):
        raise ValueError(f"invalid session id {session_id!r}")


class SessionStore:
    """Sessions and transcript messages over a ``SessionBackend``.

    ``SessionStore(backend)`` is the face over an opened backend (closing the store closes
    it). Methods are synchronous; the hot paths also have ``a``-prefixed coroutine twins that
    never block the event loop (the writer is awaited, reads run in a thread). Other async
    callers use ``asyncio.to_thread``.

    Tombstones: ``delete_session`` records the id as deleted. Writes that continue a
    session (``append_message``, ``aappend_turn`` with or without ``create``) raise
    SessionGone for it, so a turn that began before the delete cannot bring the session
    back; ``abegin_turn`` reports it ``"deleted"``. ``acreate_session`` and ``abegin_turn``
    with ``create_with`` are explicit creations made before a turn runs: they revive the id.
    """

    def __init__(self, backend: SessionBackend) -> None:
        self._backend = backend

    @property
    def backend(self) -> SessionBackend:
        return self._backend

    @property
    def path(self) -> Path:
        """The file of a backend that keeps one (SQLite)."""
        path = getattr(self._backend, "path", None)
        if not isinstance(path, Path):
            raise AttributeError(f"the session store {self._backend.url} has no file")
        return path

    @property
    def url(self) -> str:
        return self._backend.url

    # ----------------------------------------------------------------- lifecycle

    def close(self) -> None:
        """Close the backend; idempotent. Further calls raise SessionStoreError."""
        self._backend.close()

    def __enter__(self) -> SessionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- sessions

    async def acreate_session(
        self,
        session_id: str | None = None,
        *,
        source: SessionSource | None = None,
        title: str | None = None,
        exclusive: bool = False,
        metadata: Mapping[str, str] | None = None,
        messages: Sequence[tuple[str, str]] = (),
    ) -> SessionRecord:
        """Create a session, or return the existing one with that id unchanged (with
        ``exclusive``: raise SessionTaken instead).

        An explicit creation: a deleted (tombstoned) id is created afresh. ``metadata``
        and ``messages`` (role, content) are written with a session this creates, in the
        same transaction (an API conversation's).
        """
        session_id, new = self._creation(session_id, source, title, exclusive)
        if metadata or messages:
            new = replace(
                new,
                metadata_json=encode_json(metadata) if metadata else None,
                messages=tuple(
                    NewMessage.build({"role": role, "content": content})
                    for role, content in messages
                ),
            )
        return await self._backend.acreate_session(session_id, new)

    def create_session(
        self,
        session_id: str | None = None,
        *,
        source: SessionSource | None = None,
        title: str | None = None,
        exclusive: bool = False,
    ) -> SessionRecord:
        """``acreate_session`` for a caller on a thread that may block (never the event
        loop): a schedule's conversation of its own, opened inside the tool's store work."""
        session_id, new = self._creation(session_id, source, title, exclusive)
        return self._backend.create_session(session_id, new)

    @staticmethod
    def _creation(
        session_id: str | None, source: SessionSource | None, title: str | None, exclusive: bool
    ) -> tuple[str, NewSession]:
        if session_id is None:
            session_id = new_session_id()
        _check_id(session_id)
        return session_id, _new_session(source, title, exclusive)

    def get_session(self, session_id: str) -> SessionRecord | None:
        return self._backend.get_session(session_id)

    async def asessions_by_prefix(self, prefix: str, limit: int = 32) -> PrefixSessions:
        """Live sessions named ``prefix`` or ``prefix_<suffix>`` with their transcripts,
        oldest first, and whether ``prefix`` itself is deleted (reads only, one snapshot)."""
        _check_id(prefix)
        return await self._backend.asessions_by_prefix(prefix, limit)

    def list_sessions(self, limit: int = 100, offset: int = 0) -> list[SessionRecord]:
        """Most recently active first."""
        if limit < 0 or offset < 0:
            raise ValueError("limit and offset must be >= 0")
        return self._backend.list_sessions(limit, offset)

    async def aset_title(self, session_id: str, title: str, *, if_untitled: bool = False) -> bool:
        """Title a live session (with ``if_untitled``, only one that has none yet); False
        when it is not live or already titled. The title is text of at most
        ``MAX_TITLE_CHARS`` characters."""
        _check_id(session_id)
        if not isinstance(title, str) or not title.strip() or len(title) > MAX_TITLE_CHARS:
            raise ValueError(f"a title is text of 1 to {MAX_TITLE_CHARS} characters")
        return await self._backend.aset_title(session_id, title, if_untitled=if_untitled)

    async def aset_system_prompt(self, session_id: str, prompt: str | None) -> bool:
        """Give a live session its own system prompt (None or blank text clears it); False
        when it is not live. At most ``MAX_SYSTEM_PROMPT_CHARS`` characters."""
        _check_id(session_id)
        if prompt is not None and not isinstance(prompt, str):
            raise ValueError("a system prompt is text")
        if prompt is not None and len(prompt) > MAX_SYSTEM_PROMPT_CHARS:
            raise ValueError(f"a system prompt is at most {MAX_SYSTEM_PROMPT_CHARS} characters")
        return await self._backend.aset_system_prompt(
            session_id, prompt if prompt and prompt.strip() else None
        )

    async def aset_metadata(self, session_id: str, metadata: Mapping[str, str] | None) -> bool:
        """Give a live session its metadata (None or empty clears it: an API
        conversation's); False when it is not live. The caller checks its bounds."""
        _check_id(session_id)
        return await self._backend.aset_metadata(
            session_id, encode_json(metadata) if metadata else None
        )

    def delete_session(self, session_id: str) -> bool:
        """Delete a session and its transcript and leave a tombstone. False when it did not
        exist (the id is tombstoned all the same: a delete that races a session's first
        turn still wins)."""
        if not is_valid_session_id(session_id):
            return False  # no session can have it (creation checks), so nothing to record
        return self._backend.delete_session(session_id)

    def find_session_by_key(self, session_key: str) -> SessionRecord | None:
        """The most recently active session with this routing key, or None."""
        return self._backend.find_session_by_key(session_key)

    # ----------------------------------------------------------------- messages

    def append_message(
        self,
        session_id: str,
        role: str,
        content: str,
        *,
        display_kind: str | None = None,
        display_metadata: Mapping[str, Any] | None = None,
        dedupe_key: str | None = None,
    ) -> MessageRecord:
        """Append a transcript message and return it.

        With a ``dedupe_key`` already used in this session, nothing is inserted and the
        existing row is returned: a redelivered completion never shows up twice.
        Raises SessionGone for an unknown or deleted session.
        """
        message = NewMessage.build(
            {
                "role": role,
                "content": content,
                "display_kind": display_kind,
                "display_metadata": display_metadata,
                "dedupe_key": dedupe_key,
            }
        )
        return self._backend.append_message(session_id, message)

    def messages(
        self, session_id: str, *, after_id: int = 0, limit: int | None = None
    ) -> list[MessageRecord]:
        """Transcript in order, only ids > ``after_id``. Raises SessionGone for unknown sessions."""
        if limit is not None and limit < 0:
            raise ValueError("limit must be >= 0")
        return self._backend.messages(session_id, after_id, limit)

    async def asupersede(self, session_id: str, ids: Sequence[int], how: str) -> int:
        """Mark messages of the session as replaced by an edit or a regeneration (``how``:
        ``"edited"`` or ``"regenerated"``; ``"deleted"``: an API conversation's item was
        deleted): kept and shown, no longer sent to the model. How many were marked."""
        if how not in ("edited", "regenerated", "deleted"):
            raise ValueError('how is "edited", "regenerated" or "deleted"')
        if not ids:
            return 0
        return await asyncio.to_thread(self._backend.supersede, session_id, tuple(ids), how)

    def search_messages(self, text: str, limit: int = 50) -> list[MessageHit]:
        """The newest messages (at most ``limit``) of live sessions that hold every word of
        ``text`` (each as the start of a word), newest first, with a snippet; none for text
        without words."""
        terms = search_terms(text)
        if not terms or limit <= 0:
            return []
        return self._backend.search_messages(terms, limit)

    def latest_messages(
        self, session_id: str, *, before_id: int | None = None, limit: int = 200
    ) -> list[MessageRecord]:
        """A page of the transcript from its end: the ``limit`` newest messages (before
        ``before_id``, when given), in order. Raises SessionGone for unknown sessions."""
        if limit < 0:
            raise ValueError("limit must be >= 0")
        return self._backend.messages_before(session_id, before_id or _NO_ID_ABOVE, limit)

    # ----------------------------------------------------------------- turns

    async def abegin_turn(
        self, session_id: str, *, create_with: SessionSource | None = None
    ) -> TurnStart:
        """Everything a turn needs from the store before it runs: the one begin-turn API.

        The ``TurnStart`` says what the turn found: ``"live"`` (``history`` is the
        transcript in order, ``taken`` the delivery rows this turn folds, marked folded now
        so each is folded into exactly one turn, even when turns on one session race across
        processes), ``"unknown"`` (never written: a first turn stores itself with
        ``aappend_turn(..., create=)``) or ``"deleted"`` (tombstoned). With ``create_with``
        a session that is not live is created first (a deleted one afresh) and its history
        returned; the state still says what was found. Never raises SessionGone. With
        nothing to fold or create it only reads (the reader thread): no writer trip.
        """
        _check_id(session_id)
        create = _new_session(create_with, None) if create_with is not None else None
        return await self._backend.abegin_turn(session_id, create)

    async def aappend_turn(
        self,
        session_id: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        idempotency_key: str | None = None,
        response: Mapping[str, Any] | None = None,
        create: SessionSource | None = None,
        title: str | None = None,
        exclusive: bool = False,
        seen: Sequence[int] = (),
    ) -> None:
        """Append a turn's messages and, with ``idempotency_key``, record its response; the
        rows are not read back (the turn goes in as one statement where the backend can).

        One transaction: after a crash either the whole turn and its idempotency record are
        there (a repeated request gets the stored response) or neither is (the repeat runs
        the turn). Each message is a mapping with ``role`` and ``content`` and optionally
        ``display_kind``, ``display_metadata``, ``dedupe_key``.

        ``create`` (with an optional ``title``) creates the session in the same commit when
        it does not exist yet, so a first turn makes one durable trip. Raises SessionGone
        for an unknown session without ``create`` and for a deleted (tombstoned) one
        always, and SessionTaken for an existing one with ``exclusive`` (the session must be
        this turn's own); nothing is written then. ``seen`` names the folded delivery rows
        the turn's model call was shown: marked seen in the same commit (what lets
        compaction summarise them).
        """
        args = self._turn_args(
            session_id, messages, idempotency_key, response, create, title, exclusive
        )
        await self._backend.aappend_turn(session_id, args[0], seen=seen, **args[1])

    async def acompact(
        self,
        session_id: str,
        stream_id: str,
        archive_ids: Sequence[int],
        summary: Mapping[str, Any],
    ) -> MessageRecord | None:
        """Commit a compaction under the turn lease ``stream_id``: the ``summary`` message
        (a mapping like ``aappend_turn``'s) replaces ``archive_ids`` in the model's context,
        in one transaction; None, with nothing written, when the store refuses it (see
        ``delivery.session_backend.SessionBackend.acompact``)."""
        new = NewMessage.build(summary)
        return await self._backend.acompact(
            session_id, Compaction(stream_id, tuple(archive_ids), new)
        )

    @staticmethod
    def _turn_args(
        session_id: str,
        messages: Sequence[Mapping[str, Any]],
        idempotency_key: str | None,
        response: Mapping[str, Any] | None,
        create: SessionSource | None,
        title: str | None,
        exclusive: bool = False,
    ) -> tuple[list[NewMessage], dict[str, Any]]:
        # Everything is validated and encoded here, before any write.
        built = [NewMessage.build(m) for m in messages]
        new = None
        if create is not None:
            _check_id(session_id)
            new = _new_session(create, title, exclusive)
        return built, {
            "create": new,
            "idempotency_key": idempotency_key,
            "response_json": encode_json(response) if response is not None else None,
        }

    # ----------------------------------------------------------------- idempotency

    def claim_idempotent(
        self,
        key: str,
        owner: str,
        *,
        session_id: str | None = None,
        takeover: Callable[[str], bool] | None = None,
    ) -> dict[str, Any]:
        """Claim ``key`` for a first run, atomically.

        Returns the row with ``"claimed": True`` when the caller now runs the request, or
        the existing row with ``"claimed": False`` (state "done": replay its response;
        "running": someone else runs it, wait). A "running" row whose owner
        ``takeover(owner)`` declares gone (a crashed process) is taken over.
        """
        if not isinstance(key, str) or not key:
            raise ValueError("an idempotency key must be a non-empty string")
        record, claimed = self._backend.claim_idempotent(key, owner, session_id, takeover)
        return {**record.as_dict(), "claimed": claimed}

    def release_idempotent(self, key: str, owner: str) -> bool:
        """Forget a running claim (the request failed), so a repeat may run it again."""
        return self._backend.release_idempotent(key, owner)

    # ----------------------------------------------------------------- running turns

    def take_turn(
        self,
        session_id: str,
        stream_id: str,
        *,
        wakeup: bool = False,
        ttl_seconds: float = TURN_LEASE_SECONDS,
    ) -> TurnLease:
        """Hold the session for the turn ``stream_id`` on every server sharing the store:
        the lease holding it afterwards (this process's when taken). A lease whose holder
        died on this host is broken at once; one from another host lapses unless renewed."""
        return self._backend.take_turn(
            session_id,
            stream_id,
            str(current_identity()),
            wakeup=wakeup,
            ttl_seconds=ttl_seconds,
            is_dead=holder_is_dead,
        )

    def renew_turn(
        self, session_id: str, stream_id: str, ttl_seconds: float = TURN_LEASE_SECONDS
    ) -> bool:
        return self._backend.renew_turn(session_id, stream_id, ttl_seconds)

    def end_turn(self, session_id: str, stream_id: str) -> bool:
        return self._backend.end_turn(session_id, stream_id)

    def running_turns(self) -> dict[str, TurnLease]:
        """The sessions busy with a turn now, on any server (dead holders left out)."""
        return {
            t.session_id: t for t in self._backend.running_turns() if not holder_is_dead(t.owner)
        }

    def orphaned_turns(self) -> list[TurnLease]:
        """Running turns whose holder died on this host (killed mid-turn): their streams
        never ended, and nobody else will end them."""
        return [t for t in self._backend.running_turns() if holder_is_dead(t.owner)]

    def ask_approval(self, approval: ApprovalRecord) -> bool:
        return self._backend.ask_approval(approval)

    def decide_approval(
        self, approval_id: str, approve: bool, answer: str = ""
    ) -> tuple[ApprovalRecord, bool]:
        return self._backend.decide_approval(approval_id, approve, answer)

    def expire_approval(self, approval_id: str) -> tuple[ApprovalRecord, bool]:
        return self._backend.expire_approval(approval_id)

    def pending_unit_approvals(self) -> list[ApprovalRecord]:
        return self._backend.pending_unit_approvals()

    def get_approval(self, approval_id: str) -> ApprovalRecord | None:
        return self._backend.get_approval(approval_id)

    def pending_approval(self, session_id: str) -> ApprovalRecord | None:
        return self._backend.pending_approval(session_id)
