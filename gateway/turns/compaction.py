"""Compaction: a long conversation's older turns become one summary the model writes, with no
background result dropped, summarised unseen, or folded twice.

Every surface's turns (the API server, the web UI, Telegram) go through
``gateway.turns.TurnService``, which calls the one ``Compactor`` here:

* when the context a turn is about to send is estimated (``estimate_tokens``: characters / 4,
  a cheap bound that needs no tokenizer) past ``trigger`` of the model's ``context_window``;
* as a backstop, when the provider refuses a call as too long
  (``ProviderError.context_overflow``): compact harder, then retry the call once.

What a compaction does: the oldest rows of the live transcript (and the previous summary)
are summarised by one model call into ONE summary row; the rows are archived, never deleted
(``SessionStore.acompact``: one transaction, under the session's turn lease, so a crash
leaves either the whole compaction or nothing). What it never does:

* summarise a delivery row (a background result) that no stored turn's model call has seen:
  such a row is pinned, verbatim, in its place (the store refuses it too);
* fold a result a second time: folding stays the store's exactly-once take; a summarised
  result is named in the summary (its delivery id, goal and status, as structured data on
  the summary row and in its text) so the agent knows the work is done;
* take structure from text: the results it names come from the rows' metadata only (a
  delivery row's ``display_metadata``, a wake-up row's ``results``, a previous summary's
  ``deliveries``), never from what a result, a message or a model's summary says; every
  text it sends the summariser and the summary it gets back is defanged
  (``agent.markers.defang``), and a listed goal is one line;
* grow without bound: the summary's prose is capped at ``summary_chars``; past it the oldest
  prose is cut, while the list of covered deliveries is kept whole.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from agent.markers import SUMMARISE_MARKER, SUMMARY_MARKER, defang
from agent.messages import ChatMessage
from agent.providers.base import ModelProvider, ProviderError
from gateway.session import SessionStore, SessionStoreError
from gateway.turns.hold import TurnHold
from gateway.wake_text import WAKE_RESULTS_KEY, wake_results

__all__ = [
    "SUMMARISE_MARKER",
    "SUMMARY_MARKER",
    "CompactionPolicy",
    "Compactor",
    "Summarise",
    "estimate_tokens",
    "is_summary",
    "provider_summariser",
    "seen_delivery_ids",
]

logger = logging.getLogger(__name__)

SUMMARISE_PROMPT = (
    f"{SUMMARISE_MARKER} You compact a conversation between a user and an AI assistant. "
    "Write a concise summary of the conversation below that lets the assistant continue it: "
    "the user's goals and preferences, decisions made, facts and names learned, open "
    "questions, and every background task whose result arrived (what it was for and what "
    "it found). Write plain prose or short bullets; no preamble."
)

# A message costs a few tokens beyond its text (role, separators).
_PER_MESSAGE_TOKENS = 4
_LISTED_WITH_GOALS = 50  # covered deliveries a summary's text lists with their goals
_CUT_NOTE = "[... the oldest part of this summary was cut to keep it bounded ...]\n"


def estimate_tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    """A cheap upper-side estimate of a context's tokens: characters / 4, plus a few per
    message (English averages about 4 characters a token; no tokenizer is loaded)."""
    total = 0
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            chars = sum(len(str(p.get("text", ""))) for p in content if isinstance(p, dict))
        else:
            chars = len(str(content or ""))
        total += (chars + 3) // 4 + _PER_MESSAGE_TOKENS
    return total


@dataclass(frozen=True)
class CompactionPolicy:
    """When to compact and how much to keep.

    ``context_window``: the model's window in tokens (0: unknown, so only the provider's
    "context length exceeded" compacts). ``trigger``: compact when a turn's context is
    estimated past this share of the window. ``keep``: the share of the window the newest
    turns keep verbatim after a compaction. ``summary_chars``: the cap on a summary's prose.
    ``input_chars``: the most transcript text one summarisation call is sent.
    """

    context_window: int = 0
    trigger: float = 0.75
    keep: float = 0.3
    summary_chars: int = 8000
    input_chars: int = 200_000

    def __post_init__(self) -> None:
        if self.context_window < 0:
            raise ValueError("context_window must not be negative")
        if not 0 < self.keep < self.trigger <= 1:
            raise ValueError("expected 0 < keep < trigger <= 1")
        if self.summary_chars < 200:
            raise ValueError("summary_chars must be at least 200")


class SummaryMeta(TypedDict):
    """What a summary row's ``display_metadata["summary"]`` records."""

    messages: int
    first_id: int
    last_id: int
    deliveries: list[dict[str, str]]
    body: str


class SummaryDisplay(TypedDict):
    summary: SummaryMeta


class SummaryRow(TypedDict):
    """The summary message a compaction stores in place of the rows it archives."""

    role: str
    content: str
    display_metadata: SummaryDisplay


# Called with the messages of one summarisation call; returns the summary's text.
Summarise = Callable[[list[ChatMessage]], Awaitable[str]]


def provider_summariser(provider: ModelProvider) -> Summarise:
    """One plain model call (no tools, no streaming) per summary."""

    async def summarise(messages: list[ChatMessage]) -> str:
        reply = await provider.complete(messages)
        return str(reply.content or "")

    return summarise


def is_summary(row: Mapping[str, Any]) -> bool:
    """Whether a transcript row (``MessageRecord.as_dict``) is a compaction summary."""
    meta = row.get("display_metadata") or {}
    return row.get("display_kind") is None and isinstance(meta.get("summary"), dict)


def _pinned(row: Mapping[str, Any], taken: set[int]) -> bool:
    """A delivery row no stored turn has seen yet stays verbatim."""
    if row.get("display_kind") is None:
        return False
    return row["id"] in taken or not row.get("folded") or not row.get("seen")


def seen_delivery_ids(
    history: Sequence[Mapping[str, Any]],
    taken: Sequence[Mapping[str, Any]],
    context: Sequence[Mapping[str, Any]],
) -> list[int]:
    """The delivery rows a model call with ``context`` was shown: this turn's take (always
    sent) and the earlier ones still in the history whose text is in the context (the
    character bound may have left an old one out: that one is not seen by this call)."""
    seen = [int(row["id"]) for row in taken]
    taken_ids = set(seen)
    sent = "\n".join(str(m.get("content") or "") for m in context if m.get("role") == "system")
    for row in history:
        if (
            row.get("display_kind") is not None
            and row.get("folded")
            and not row.get("seen")
            and not row.get("archived")
            and row["id"] not in taken_ids
            and str(row["content"]).rstrip() in sent
        ):
            seen.append(int(row["id"]))
    return seen


@dataclass(frozen=True)
class _Plan:
    # Transcript rows (``MessageRecord.as_dict``), read only.
    archive: list[Mapping[str, Any]]  # oldest first; previous summaries among them
    kept: list[Mapping[str, Any]]


def _plan(
    history: Sequence[Mapping[str, Any]],
    taken: set[int],
    policy: CompactionPolicy,
    *,
    force: bool,
) -> _Plan | None:
    active = [dict(r) for r in history if not r.get("archived")]
    if force or not policy.context_window:
        keep_tokens = 0  # the backstop: all but the newest exchange and the pinned
    else:
        keep_tokens = int(policy.context_window * policy.keep)
    # The newest rows stay verbatim while they fit (the last exchange always does).
    cut = len(active)
    used = 0
    minimum = 2
    while cut > 0:
        row = active[cut - 1]
        cost = estimate_tokens([row])
        if len(active) - cut >= minimum and used + cost > keep_tokens:
            break
        used += cost
        cut -= 1
    older = active[:cut]
    archive: list[Mapping[str, Any]] = [r for r in older if not _pinned(r, taken)]
    if not any(not is_summary(r) for r in archive):
        return None  # nothing new to summarise
    # A previous summary is rolled into the new one wherever it stands: one summary at most.
    archive += [r for r in active[cut:] if is_summary(r)]
    archive.sort(key=lambda r: r["id"])
    ids = {r["id"] for r in archive}
    return _Plan(archive, [r for r in active if r["id"] not in ids])


def _covered(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """The background results ``rows`` hold (delivery rows, wake-up turns, earlier
    summaries), each once, oldest first: what the summary names as done."""
    out: dict[str, dict[str, str]] = {}

    def add(meta: Mapping[str, Any]) -> None:
        rid = meta.get("delegation_id") or meta.get("delivery_id") or meta.get("process_id")
        if not rid:
            return
        goals = meta.get("goals")
        goal = meta.get("goal") or meta.get("command") or ""
        if not goal and isinstance(goals, list):
            goal = "; ".join(str(g) for g in goals)
        ident = _one_line(rid, 128)
        if not ident or ident in out:
            return
        out[ident] = {
            "id": ident,
            "goal": _one_line(goal, 200),
            "status": _one_line(meta.get("status") or "", 32),
        }

    for row in rows:
        meta = row.get("display_metadata") or {}
        if is_summary(row):
            for item in meta["summary"].get("deliveries") or []:
                if isinstance(item, dict):
                    add(item | {"delegation_id": item.get("id")})
        elif row.get("display_kind") is not None:
            add(meta)
        elif row.get("role") == "user" and meta.get("wake"):
            results = meta.get(WAKE_RESULTS_KEY)
            if not isinstance(results, list):
                # A wake-up stored before its row kept its results: only the data lines
                # the formatter wrote, where it wrote them (``wake_results``).
                results = wake_results(str(row.get("content") or ""))
            for data in results:
                if isinstance(data, Mapping):
                    add(data)
    return list(out.values())


def _one_line(value: Any, cap: int) -> str:
    """A field of the summary's list: defanged, on one line (a newline in a goal would
    start a list entry of its own), capped."""
    return defang(" ".join(str(value).split()))[:cap]


def _transcript_text(rows: Sequence[Mapping[str, Any]], budget: int) -> str:
    """The rows to summarise as labelled text, newest kept when over ``budget``."""
    lines: list[str] = []
    for row in rows:
        if is_summary(row):
            continue  # its prose is kept beside the new one; the model need not redo it
        meta = row.get("display_metadata") or {}
        if row.get("display_kind") is not None:
            label = "background result delivered"
        elif meta.get("failed"):
            continue  # never answered: not part of the conversation
        elif row.get("role") == "user" and meta.get("wake"):
            label = "background result (wake-up)"
        else:
            label = str(row.get("role"))
        # A person's text, a result's, a reply that may quote either: no marker in any of
        # them means anything to the summariser.
        text = defang(str(row.get("content") or "").strip())
        lines.append(f"{label}: {text}")
    text = "\n\n".join(lines)
    if len(text) > budget:
        text = "[... older messages left out ...]\n" + text[len(text) - budget :]
    return text


def _summary_text(count: int, deliveries: list[dict[str, str]], body: str) -> str:
    lines = [
        f"{SUMMARY_MARKER} Summary of {count} earlier message(s) of this conversation "
        "(the originals are archived; they are no longer shown to you)."
    ]
    if deliveries:
        lines.append(
            "Background work that already finished and whose results were delivered in this "
            "conversation (it is done: do not start it again):"
        )
        # The newest with their goals; older ones by id only, so the list stays short
        # while every covered id is still named.
        older, newest = deliveries[:-_LISTED_WITH_GOALS], deliveries[-_LISTED_WITH_GOALS:]
        if older:
            lines.append("- earlier: " + ", ".join(d["id"] for d in older))
        for d in newest:
            status = f" [{d['status']}]" if d["status"] else ""
            lines.append(f"- {d['id']}{status}: {d['goal']}")
    lines.append("")
    lines.append(body.strip())
    return "\n".join(lines)


def _bounded(body: str, cap: int) -> str:
    """``body`` within ``cap`` characters: past it the oldest text is cut, with a note."""
    if len(body) <= cap:
        return body
    keep = cap - len(_CUT_NOTE)
    return _CUT_NOTE + body[len(body) - keep :]


class Compactor:
    """Compacts sessions of a ``SessionStore`` with a ``Summarise`` call (see the module
    docstring). One per turn service; it holds no state of its own between turns."""

    def __init__(self, store: SessionStore, summarise: Summarise, policy: CompactionPolicy) -> None:
        self.store = store
        self.summarise = summarise
        self.policy = policy
        self.compactions = 0  # committed here (read by tests and metrics)

    def due(self, context: Sequence[Mapping[str, Any]]) -> bool:
        """Whether a turn about to send ``context`` should compact first."""
        window = self.policy.context_window
        return bool(window) and estimate_tokens(context) > window * self.policy.trigger

    async def compact(
        self,
        session_id: str,
        history: Sequence[Mapping[str, Any]],
        taken: Sequence[Mapping[str, Any]] = (),
        *,
        lease: str | None = None,
        force: bool = False,
    ) -> list[dict[str, object]] | None:
        """Compact ``history`` (the transcript a turn read, ``MessageRecord.as_dict`` rows;
        ``taken`` the rows that turn folds): the history the turn goes on with (the summary
        last, where the store put it), or None when nothing was compacted (nothing to
        summarise, the session busy with another turn, the model failing, or the store
        refusing: what was there stays as it was).

        ``lease`` is the stream id of the turn lease the caller holds (the web UI's turns);
        without one the compaction takes the session's lease itself for its duration.
        """
        plan = _plan(history, {int(r["id"]) for r in taken}, self.policy, force=force)
        if plan is None:
            return None
        async with self._lease(session_id, lease) as stream_id:
            if stream_id is None:
                logger.info("session %s is busy: not compacted now", session_id)
                return None
            summary = await self._summary_row(plan.archive)
            if summary is None:
                return None
            try:
                record = await self.store.acompact(
                    session_id, stream_id, [r["id"] for r in plan.archive], summary
                )
            except SessionStoreError as exc:
                logger.warning("could not store the compaction of %s: %s", session_id, exc)
                return None
        if record is None:
            logger.info("compaction of %s refused by the store (raced); not compacted", session_id)
            return None
        self.compactions += 1
        logger.info("compacted %d message(s) of %s", len(plan.archive), session_id)
        archived = {r["id"] for r in plan.archive}
        return [
            *(
                {**r, "archived": True} if r["id"] in archived else dict(r)
                for r in history
                if not r.get("archived") or r["id"] in archived
            ),
            record.as_dict(),
        ]

    async def summary_of(self, rows: list[Mapping[str, Any]]) -> SummaryRow | None:
        """The summary row of ``rows`` (transcript rows, oldest first) without storing
        anything: ``POST /v1/responses/compact`` answers with it. None when the model
        failed or wrote nothing."""
        return await self._summary_row(rows)

    async def _summary_row(self, rows: list[Mapping[str, Any]]) -> SummaryRow | None:
        previous = [r for r in rows if is_summary(r)]
        prior_body = ""
        prior_count = 0
        for row in previous:
            prior = row["display_metadata"]["summary"]
            prior_body = f"{prior_body}\n\n{prior.get('body') or ''}".strip()
            prior_count += int(prior.get("messages") or 0)
        fresh = [r for r in rows if not is_summary(r)]
        budget = max(self.policy.input_chars, 1000)
        request: list[ChatMessage] = [
            {"role": "system", "content": SUMMARISE_PROMPT},
            {
                "role": "user",
                "content": (
                    (
                        f"The conversation so far was summarised before as:\n{prior_body}\n\n"
                        if prior_body
                        else ""
                    )
                    + "Summarise these later messages:\n\n"
                    + _transcript_text(fresh, budget)
                ),
            },
        ]
        try:
            text = (await self.summarise(request)).strip()
        except ProviderError as exc:
            logger.warning("the summarisation call failed: %s", exc)
            return None
        if not text:
            return None
        # The model's prose may repeat whatever it was shown: defanged, it cannot add a
        # marker or a line of the list of finished work to the summary.
        body = _bounded(defang(f"{prior_body}\n\n{text}".strip()), self.policy.summary_chars)
        deliveries = _covered(rows)
        count = prior_count + len(fresh)
        meta: SummaryDisplay = {
            "summary": {
                "messages": count,
                "first_id": min(r["id"] for r in rows),
                "last_id": max(r["id"] for r in rows),
                "deliveries": deliveries,
                "body": body,
            }
        }
        return {
            "role": "system",
            "content": _summary_text(count, deliveries, body),
            "display_metadata": meta,
        }

    @contextlib.asynccontextmanager
    async def _lease(self, session_id: str, held: str | None) -> AsyncIterator[str | None]:
        """The turn lease a compaction runs under: the caller's, or one taken here (renewed
        while a slow summarising call runs, since the commit checks it, then ended); None
        when another turn holds the session."""
        if held is not None:
            yield held
            return
        hold = TurnHold(self.store, session_id)
        try:
            taken = await hold.take()
        except SessionStoreError as exc:
            logger.warning("could not take session %s to compact it: %s", session_id, exc)
            taken = False
        if not taken:
            yield None
            return
        try:
            yield hold.stream_id
        finally:
            await hold.release()
