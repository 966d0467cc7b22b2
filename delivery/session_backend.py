"""The storage seam of the session store: its typed records, and its protocol split by audience.

``gateway.session.SessionStore`` is the face callers use; it speaks ``SessionBackend`` to a
backend the opener hands out (``storage.{sqlite,postgres,memory}.sessions``). The protocol
is the union of three audiences, and a caller types its dependency with the narrowest:
``SessionTurns`` (the turn service's writes), ``SessionViews`` (the read-only views of the
web UI, operators and metrics) and ``SessionUpkeep`` (compaction and retention). Its rules
are written once, in ``delivery.session_rules``, over the row-level port every dialect
implements (``delivery.session_rows``); ``tests/sessions/`` proves them on every backend:

* Each operation is atomic; a write that raises has written nothing.
* Message ids grow across the whole store and are never reused (clients page with
  ``after_id``). A ``dedupe_key`` is unique per session: a repeat returns the first row.
* Folding is exactly once: a delivery row (``display_kind`` set) is handed to one turn only,
  however many turns or processes race for it.
* Tombstones: deleting a session id records a tombstone. The id's state is then "deleted"
  (as ``abegin_turn`` reports it), and writes that only *continue* a session
  (``append_message``, ``aappend_turn``, and ``aappend_turn`` with ``create``) raise
  SessionGone for it: a turn that started before the delete can never silently bring the
  session back. Only an explicit creation (``acreate_session``, or ``abegin_turn`` with
  ``create``, both made before a turn runs) revives the id and clears its tombstone.
* A begin-turn with nothing to fold only reads; it reaches the writer only to fold or create.
* Compaction archives, never deletes: ``acompact`` writes one summary row and marks the rows
  it replaces archived (``archived_at``, and the summary's id) in one commit, and only
  while the caller's turn lease holds the session. A delivery row is archived only once a
  stored turn saw it (``seen``: ``aappend_turn`` marks the rows its model call was shown, in
  the turn's own commit); anything else refuses the whole compaction and writes nothing.
  Archived rows stay in every transcript read, flagged ``archived``.
* A session's running turn is a lease (``take_turn``): one holder at a time across every
  process sharing the store; a holder whose lease lapsed, or that ``is_dead`` declares gone,
  loses it to the next taker. An approval belongs to the turn that asked it and is pending
  only while that turn holds its session; it is decided once.
* A background unit's approval (``unit_id`` set: a sub-agent, any detached work) holds no
  session: it is recorded whatever turn runs, pending until decided or settled
  ``expired`` (its ``expires_at`` passed, or its unit's process died), once.

Backends receive validated, pre-encoded values (``NewMessage``, ``NewSession`` and JSON
text), so each encodes and validates nothing itself and all of them agree on what is legal.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

__all__ = [
    "ApprovalRecord",
    "ApprovalStatus",
    "Compaction",
    "IdempotencyRecord",
    "MessageHit",
    "MessageRecord",
    "NewMessage",
    "NewSession",
    "PrefixSessions",
    "SessionBackend",
    "SessionGone",
    "SessionRecord",
    "SessionState",
    "SessionStoreError",
    "SessionTaken",
    "SessionTurns",
    "SessionUpkeep",
    "SessionViews",
    "TurnLease",
    "TurnStart",
    "encode_json",
    "holds_terms",
    "mark_snippet",
    "search_terms",
]

SessionState = Literal["live", "deleted", "unknown"]
ApprovalStatus = Literal["pending", "approved", "denied", "expired"]


class SessionGone(LookupError):
    """The session does not exist (never created, or deleted): a delivery to it is dropped.

    A domain error rather than the built-in ``KeyError``, so that a stray ``KeyError`` from a
    bug can never be mistaken for "the session is gone" and drop a result for good.
    """

    def __init__(self, session_id: str, *, reason: str | None = None) -> None:
        super().__init__(reason or f"session {session_id!r} does not exist")
        self.session_id = session_id
        self.reason = reason
        """Why the conversation is gone, when it is not a deletion (a chat that blocked the
        bot): what a dropped delivery records."""


class SessionTaken(Exception):
    """A session meant to be created afresh (``NewSession.exclusive``) exists already:
    another conversation created it first, and this one must not write into it."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} was created by another conversation")
        self.session_id = session_id


class SessionStoreError(RuntimeError):
    """The session database cannot be used (not a database, newer schema, closed...)."""


def encode_json(value: Mapping[str, Any]) -> str:
    """The stored text of a JSON column; raises TypeError for values JSON cannot hold."""
    return json.dumps(dict(value), ensure_ascii=False)


def decode_json(text: str | None) -> Any:
    return json.loads(text) if text is not None else None


# --------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class NewSession:
    """What a session is created with; ``source_json`` is ``SessionSource.to_dict`` as JSON.

    ``exclusive``: the id must be new; a live session with it raises ``SessionTaken``
    instead of being joined (another conversation created it since it was read).
    """

    source_json: str | None = None
    session_key: str | None = None
    title: str | None = None
    exclusive: bool = False
    # Written in the same transaction as the session, only when this creates it (an API
    # conversation's metadata and first items: never half made).
    metadata_json: str | None = None
    messages: tuple[NewMessage, ...] = ()


@dataclass(frozen=True, slots=True)
class NewMessage:
    """A validated message to append; build it with ``NewMessage.build``."""

    role: str
    content: str
    display_kind: str | None = None
    metadata_json: str | None = None
    dedupe_key: str | None = None

    @classmethod
    def build(cls, message: Mapping[str, Any]) -> NewMessage:
        """From a mapping with ``role``, ``content`` and optionally ``display_kind``,
        ``display_metadata``, ``dedupe_key``; raises before anything is written."""
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not role:
            raise ValueError("role must be a non-empty string")
        if not isinstance(content, str):
            raise TypeError(f"content must be a string, got {type(content).__name__}")
        meta = message.get("display_metadata")
        return cls(
            role=role,
            content=content,
            display_kind=message.get("display_kind"),
            metadata_json=encode_json(meta) if meta is not None else None,
            dedupe_key=message.get("dedupe_key"),
        )


@dataclass(frozen=True, slots=True)
class SessionRecord:
    id: str
    source: dict[str, Any] | None
    session_key: str | None
    title: str | None
    created_at: float
    updated_at: float
    system_prompt: str | None = None
    """The chat's own system prompt (set in the web UI), given to the model on its turns."""
    metadata: dict[str, str] | None = None
    """An API conversation's metadata (``/v1/conversations``): up to 16 strings a client
    attaches; never shown to the model."""

    def as_dict(self) -> dict[str, Any]:
        """The shape ``SessionStore`` has always returned."""
        return {
            "id": self.id,
            "source": dict(self.source) if self.source is not None else None,
            "session_key": self.session_key,
            "title": self.title,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "system_prompt": self.system_prompt,
        }


@dataclass(frozen=True, slots=True)
class MessageRecord:
    id: int
    role: str
    content: str
    created_at: float
    display_kind: str | None
    display_metadata: dict[str, Any] | None
    folded: bool
    # Compaction (see ``acompact``): a delivery row a stored turn's model call was shown; a
    # row a summary replaced in the model's context (it stays readable); that summary's id.
    seen: bool = False
    archived: bool = False
    summary_id: int | None = None

    @property
    def is_delivery(self) -> bool:
        return self.display_kind is not None

    def as_folded(self) -> MessageRecord:
        return replace(self, folded=True)

    def as_dict(self) -> dict[str, Any]:
        meta = self.display_metadata
        return {
            "id": self.id,
            "role": self.role,
            "content": self.content,
            "created_at": self.created_at,
            "display_kind": self.display_kind,
            "display_metadata": dict(meta) if meta is not None else None,
            "folded": self.folded,
            "seen": self.seen,
            "archived": self.archived,
            "summary_id": self.summary_id,
        }


@dataclass(frozen=True, slots=True)
class IdempotencyRecord:
    key: str
    state: Literal["running", "done"]
    owner: str | None
    session_id: str | None
    response: dict[str, Any] | None
    created_at: float
    updated_at: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "state": self.state,
            "owner": self.owner,
            "session_id": self.session_id,
            "response": dict(self.response) if self.response is not None else None,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }


@dataclass(frozen=True, slots=True)
class TurnLease:
    """A session's running turn: while its lease is live the session is busy on every server.

    ``owner`` is the holding process's identity (``delivery.identity``): on its own host a
    dead holder is known at once; elsewhere its lease lapses at ``expires_at`` unless the
    holder renews it.
    """

    session_id: str
    stream_id: str
    owner: str
    wakeup: bool
    started_at: float
    expires_at: float


@dataclass(frozen=True, slots=True)
class ApprovalRecord:
    """A human confirmation asked by the turn ``stream_id`` of ``session_id``, or, with
    ``unit_id`` set (``stream_id`` empty), by a background unit of that conversation (a
    sub-agent's delegation id): then it holds no session, ``owner`` is the process the unit
    runs in and nobody can answer it after ``expires_at``."""

    id: str
    session_id: str
    stream_id: str
    command: str
    status: ApprovalStatus
    created_at: float
    unit_id: str = ""
    owner: str = ""
    expires_at: float = 0.0
    # An MCP server's form (``tools.mcp.elicitation``): its requestedSchema as JSON text, and
    # the values a person approved it with (JSON text, checked against it). "" for a yes/no.
    form: str = ""
    answer: str = ""

    @property
    def background(self) -> bool:
        return bool(self.unit_id)

    def as_dict(self) -> dict[str, Any]:
        shown: dict[str, Any] = {"id": self.id, "command": self.command, "status": self.status}
        if self.background:
            shown.update(unit_id=self.unit_id, expires_at=self.expires_at)
        if self.form:
            shown["form"] = json.loads(self.form)
        return shown


@dataclass(frozen=True, slots=True)
class TurnStart:
    """What a turn reads before it runs.

    ``state`` is the session's state as the turn found it, before any creation; ``history``
    the transcript in order as it was before this turn's fold, less the rows a compaction
    archived (its summary is there instead); ``taken`` the delivery rows
    this turn folded (marked folded now: no other turn gets them). Both are empty unless
    the session is live or was created by this call.
    """

    state: SessionState
    history: tuple[MessageRecord, ...] = ()
    taken: tuple[MessageRecord, ...] = ()


@dataclass(frozen=True, slots=True)
class Compaction:
    """One compaction to commit: ``summary`` replaces the rows ``archive_ids`` in the model's
    context. ``stream_id`` is the turn lease it runs under: the commit happens only while
    that lease still holds the session, so no turn or wake-up slips in between."""

    stream_id: str
    archive_ids: tuple[int, ...]
    summary: NewMessage


@dataclass(frozen=True, slots=True)
class PrefixSessions:
    """The sessions an opening names, read in one snapshot: what a headerless API request
    may be continuing.

    ``transcripts`` are the live sessions whose id is the prefix or ``prefix_<suffix>``,
    oldest first, each with its transcript. ``prefix_deleted`` says the id ``prefix``
    itself is tombstoned (deleted and not created again), so that a caller can tell a
    never-written id from a deleted one without reading again.
    """

    transcripts: tuple[tuple[str, tuple[MessageRecord, ...]], ...]
    prefix_deleted: bool = False


# --------------------------------------------------------------------------- search

# What a search matches: words of letters and digits, each as the start of a word of the
# message (every backend splits text the same way, so all of them find the same rows).
_WORD = re.compile(r"[^\W_]+")
MAX_SEARCH_TERMS = 8
MAX_TERM_CHARS = 64
SNIPPET_START = "\x02"
SNIPPET_END = "\x03"
"""The marks around each matched word in ``MessageHit.snippet`` (characters no message
text is shown with: the web UI splits on them and shows every piece as text)."""
_SNIPPET_WORDS = 12
_SPACE = re.compile(r"\s+")


def search_terms(text: str) -> tuple[str, ...]:
    """The words a search for ``text`` matches, lower-cased, at most ``MAX_SEARCH_TERMS``
    (each cut to ``MAX_TERM_CHARS``); empty when it has none."""
    found: list[str] = []
    for word in _WORD.findall(text.lower()):
        word = word[:MAX_TERM_CHARS]
        if word not in found:
            found.append(word)
    return tuple(found[:MAX_SEARCH_TERMS])


def holds_terms(text: str, terms: Sequence[str]) -> bool:
    """Whether every term starts a word of ``text`` (how the memory backends match)."""
    lowered = [word.lower() for word in _WORD.findall(text)]
    return all(any(w.startswith(t) for w in lowered) for t in terms)


def mark_snippet(text: str, terms: Sequence[str]) -> str | None:
    """A few words of ``text`` around its first word that starts with a term, each such
    word between ``SNIPPET_START`` and ``SNIPPET_END``; None unless every term starts a word
    of it (what the memory backend matches by; the SQL backends have their own)."""
    words = [(m.start(), m.end()) for m in _WORD.finditer(text)]
    if not holds_terms(text, terms):
        return None
    lowered = [text[a:b].lower() for a, b in words]
    hits = [i for i, w in enumerate(lowered) if any(w.startswith(t) for t in terms)]
    first = max(0, hits[0] - _SNIPPET_WORDS // 3)
    last = min(len(words), first + _SNIPPET_WORDS)
    out: list[str] = ["\u2026 "] if first > 0 else []
    cursor = words[first][0]
    for i in range(first, last):
        a, b = words[i]
        out.append(_SPACE.sub(" ", text[cursor:a]))
        piece = text[a:b]
        out.append(f"{SNIPPET_START}{piece}{SNIPPET_END}" if i in hits else piece)
        cursor = b
    if last < len(words):
        out.append(" \u2026")
    return "".join(out).strip()


@dataclass(frozen=True, slots=True)
class MessageHit:
    """A message a search found: its session, where it is, and a snippet of its text with
    the matched words between ``SNIPPET_START`` and ``SNIPPET_END``."""

    session_id: str
    message_id: int
    role: str
    created_at: float
    snippet: str


# --------------------------------------------------------------------------- protocol


class SessionTurns(Protocol):
    """The turn service's side: what conversations write. Sessions created, titled and
    deleted; a turn begun (folding what waits) and stored with its idempotency record; the
    turn lease and the approvals its turn asks.

    Every method may raise SessionStoreError (closed, unavailable). Methods with an ``a``
    prefix are coroutines that never block the event loop on I/O. Records are snapshots:
    callers cannot change the store through them.
    """

    async def acreate_session(self, session_id: str, new: NewSession) -> SessionRecord:
        """Create (reviving a tombstoned id), or return the existing session unchanged."""

    def create_session(self, session_id: str, new: NewSession) -> SessionRecord:
        """``acreate_session`` from a thread that may block (a schedule's own conversation
        is opened inside a tool's blocking store work)."""

    async def aset_title(self, session_id: str, title: str, *, if_untitled: bool) -> bool:
        """Give a live session its title (only when it has none, with ``if_untitled``);
        True when the title was set."""

    async def aset_system_prompt(self, session_id: str, prompt: str | None) -> bool:
        """Set (None: clear) a live session's system prompt; True when it is live."""

    async def aset_metadata(self, session_id: str, metadata_json: str | None) -> bool:
        """Set (None: clear) a live session's metadata (JSON text); True when it is live."""

    def delete_session(self, session_id: str) -> bool:
        """Delete the session and its transcript and tombstone the id (even when it was not
        live: a delete racing a session's first turn still wins). True when a live session
        was removed."""

    def append_message(self, session_id: str, message: NewMessage) -> MessageRecord:
        """Append one message (or return the row its dedupe key already names)."""

    async def abegin_turn(self, session_id: str, create: NewSession | None) -> TurnStart: ...

    async def aappend_turn(
        self,
        session_id: str,
        messages: Sequence[NewMessage],
        *,
        create: NewSession | None = None,
        idempotency_key: str | None = None,
        response_json: str | None = None,
        seen: Sequence[int] = (),
    ) -> None:
        """Append a turn and, with ``idempotency_key``, record its response as done, in one
        commit. ``create`` inserts the session when absent; a tombstoned id raises
        SessionGone whether or not ``create`` is given. ``seen``: the folded delivery rows
        of this session the turn's model call was shown, marked seen in the same commit.
        The rows are not read back (a transcript read shows them)."""

    def claim_idempotent(
        self,
        key: str,
        owner: str,
        session_id: str | None,
        takeover: Callable[[str], bool] | None,
    ) -> tuple[IdempotencyRecord, bool]:
        """The record and whether ``owner`` holds the claim now (see ``SessionStore``)."""

    def release_idempotent(self, key: str, owner: str) -> bool: ...

    def take_turn(
        self,
        session_id: str,
        stream_id: str,
        owner: str,
        *,
        wakeup: bool,
        ttl_seconds: float,
        is_dead: Callable[[str], bool],
    ) -> TurnLease:
        """Hold ``session_id`` for the turn ``stream_id``: the lease holding it afterwards,
        this one when taken, else the live holder's. A lapsed lease, or one whose owner
        ``is_dead``, is broken (its pending approvals are denied)."""

    def renew_turn(self, session_id: str, stream_id: str, ttl_seconds: float) -> bool:
        """Extend the turn's lease; False when it no longer holds the session."""

    def end_turn(self, session_id: str, stream_id: str) -> bool:
        """Free the session if the turn holds it and deny what it still asks."""

    def ask_approval(self, approval: ApprovalRecord) -> bool:
        """Record a pending approval; False (nothing written) when its turn no longer holds
        the session. A background unit's (``unit_id``) is recorded whatever holds it."""

    def decide_approval(
        self, approval_id: str, approve: bool, answer: str = ""
    ) -> tuple[ApprovalRecord, bool]:
        """Decide a pending approval (``answer``: a form's values, JSON, kept with a yes):
        the record afterwards and whether this call decided it (False: decided before).
        KeyError for an unknown id."""

    def expire_approval(self, approval_id: str) -> tuple[ApprovalRecord, bool]:
        """Settle a pending approval as ``expired`` (nobody can answer it any more), like
        ``decide_approval``."""


class SessionViews(Protocol):
    """The read-only side: what the web UI, operators and metrics read (sessions,
    transcripts, search, running turns, approvals, counters). Nothing here writes."""

    @property
    def url(self) -> str:
        """Where the store is, e.g. ``sqlite:///abs/path/sessions.db`` or ``memory://...``."""

    def get_session(self, session_id: str) -> SessionRecord | None: ...

    def list_sessions(self, limit: int, offset: int) -> list[SessionRecord]:
        """Most recently active first (``updated_at`` descending, then id)."""

    def find_session_by_key(self, session_key: str) -> SessionRecord | None:
        """The most recently active session with this routing key."""

    async def asessions_by_prefix(self, prefix: str, limit: int) -> PrefixSessions:
        """Live sessions whose id is ``prefix`` or starts with ``prefix + "_"``, with their
        transcripts, oldest session first (at most ``limit``), and whether ``prefix`` itself
        is tombstoned: the candidates a headerless API request may be continuing."""

    def search_messages(self, terms: Sequence[str], limit: int) -> list[MessageHit]:
        """The newest ``limit`` messages of live sessions in which every term starts a word
        (``search_terms``), newest first: SQLite full-text search (FTS5), PostgreSQL's
        (tsvector), a scan in memory."""

    def messages(self, session_id: str, after_id: int, limit: int | None) -> list[MessageRecord]:
        """Transcript in order, ids > ``after_id``; SessionGone unless live."""

    def messages_before(self, session_id: str, before_id: int, limit: int) -> list[MessageRecord]:
        """The ``limit`` newest messages with ids < ``before_id``, in order (a page of the
        transcript read from its end); SessionGone unless live."""

    def running_turns(self) -> list[TurnLease]:
        """The leases not lapsed (a dead holder's included: the caller judges it)."""

    def get_approval(self, approval_id: str) -> ApprovalRecord | None: ...

    def pending_approval(self, session_id: str) -> ApprovalRecord | None:
        """The approval the session's running turn waits for, if any."""

    def pending_unit_approvals(self) -> list[ApprovalRecord]:
        """Every pending approval of a background unit, oldest first (expired ones
        included: the caller settles them)."""

    def approval_counts(self) -> dict[str, int]:
        """Stored approvals by status: pending, and decided ones while they are kept (the
        ``reveille_approvals`` metric)."""

    def stats(self) -> dict[str, int]:
        """Counters; ``writes`` counts committed write operations (reads never add to it)."""


class SessionUpkeep(Protocol):
    """Compaction and retention: what rewrites or forgets stored rows, never what a turn
    needs to run (a compaction, a superseded message, the prunes of ``delivery.retention``)."""

    async def acompact(self, session_id: str, compaction: Compaction) -> MessageRecord | None:
        """Commit a compaction in one transaction: insert the summary row and archive the
        rows it replaces (``archived_at`` now, ``summary_id`` the summary's id). None, with
        nothing written, unless the lease ``compaction.stream_id`` holds the live session
        and every row named is this session's, not archived, and (a delivery row) folded
        and seen."""

    def supersede(self, session_id: str, ids: Sequence[int], how: str) -> int:
        """Mark the session's messages ``ids`` (not delivery rows) superseded (an edit or a
        regeneration replaced them): ``display_metadata["superseded"] = how``. They stay in
        the transcript, shown as earlier versions, and leave the model's context. How many."""

    def prune_idempotency(self, before: float, limit: int, *, dry_run: bool = False) -> int:
        """Forget at most ``limit`` finished idempotency records last written before
        ``before`` (with ``dry_run`` only count them); a running one is a live claim and is
        never touched. How many."""

    def prune_tombstones(self, before: float, limit: int, *, dry_run: bool = False) -> int:
        """Forget at most ``limit`` tombstones of deleted sessions recorded before
        ``before`` (only count them with ``dry_run``); how many."""

    def prune_archived_messages(self, before: float, limit: int, *, dry_run: bool = False) -> int:
        """Delete at most ``limit`` transcript rows a compaction archived before ``before``
        (only count them with ``dry_run``); how many. Never an unarchived row (the live
        summary included), never a delivery row no turn has folded."""

    def unfolded_deliveries(self, wanted: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        """Of the (session id, dedupe key) pairs, those naming a delivery row that no turn
        has folded yet: results their conversation has still to see."""


class SessionBackend(SessionTurns, SessionViews, SessionUpkeep, Protocol):
    """The whole session store, as the opener hands it out and ``SessionStore`` wraps it."""

    def close(self) -> None:
        """Idempotent; any later call raises SessionStoreError."""
