"""The rules of inbound events: what happens, durably, when an event is posted to a hook, and
how a ``wake_when`` wait meets its event.

- ``receive``: the event is stored first (``HookBackend.record_event``: a re-post of the same
  ``webhook-id`` stores nothing new), then routed, all before the sender gets its 2xx. A hook
  with a configured conversation gets a ledger row due now (kind ``inbound``) whose id is
  derived from ``(hook, webhook-id)``, so routing an event twice (a re-post after a crash
  between the store and the 2xx) writes it once. Then every open wait on the hook whose
  match holds is fired.
- A wait (``set_wait``) is a ledger row written at once, due at its expiry with an
  ``expired`` completion: if nothing matches, that is what the conversation is told, never
  silence. A match brings the row forward with the event in place (``Ledger.bring_forward``:
  one compare-and-set the expiry's claim races against), so a wait fires exactly once,
  matched or expired. After writing the row, ``set_wait`` looks back over the hook's stored
  events within its window. An event stored after that look finds the wait open at its own
  look; an event stored before is found by it; when both look, the compare-and-set lets one
  win. So an event that arrives while a wait is being set is never missed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

from delivery.errors import DuplicateDeliveryError
from delivery.events import INBOUND_EVENT, INBOUND_KIND, WAIT_KIND
from delivery.ids import new_id
from delivery.inbound_backend import HookBackend, HookEvent
from delivery.rows import LedgerRow, RowQuery

if TYPE_CHECKING:
    from delivery.ledger import Ledger

__all__ = [
    "LOOKBACK_LIMIT",
    "OPEN_WAITS_LIMIT",
    "HookRoute",
    "Inbox",
    "Receipt",
    "WaitMatch",
    "WaitOrigin",
    "receive",
    "routed_row_id",
    "set_wait",
]

LOOKBACK_LIMIT = 500
"""At most this many stored events are looked back over when a wait is set."""
OPEN_WAITS_LIMIT = 10_000
"""At most this many open waits are matched against one arriving event."""


@dataclass(frozen=True, slots=True)
class HookRoute:
    """A hook's settings (``[hooks.NAME]``): the conversation its events go to (a session
    id of the session store), if any."""

    name: str
    session: str | None = None


@dataclass(frozen=True, slots=True)
class Inbox:
    """What the hook endpoint and the ``wake_when`` tool share: the store, the declared
    hooks by name, and how far back a new wait looks."""

    store: HookBackend
    routes: Mapping[str, HookRoute]
    lookback_seconds: float = 3600.0

    @classmethod
    def of(cls, store: HookBackend, routes: Sequence[HookRoute], lookback_seconds: float) -> Inbox:
        return cls(store, {r.name: r for r in routes}, lookback_seconds)


@dataclass(frozen=True, slots=True)
class Receipt:
    """What one post did: ``duplicate`` when its ``webhook-id`` was stored already;
    ``routed`` the ledger row of the configured conversation's wake-up (None: the hook has
    none); ``fired`` the waits it brought forward."""

    duplicate: bool
    routed: str | None
    fired: tuple[str, ...]


class MatchSpec(TypedDict):
    """A ``WaitMatch`` as the wait's stored event keeps it (``match_spec``)."""

    path: str | None
    equals: Any
    contains: str | None


class EventFields(TypedDict):
    """What a wake-up's event says of the inbound event it carries."""

    hook: str
    webhook_id: str
    received_at: float
    payload: str


@dataclass(frozen=True, slots=True)
class WaitMatch:
    """What a wait waits for: the value at ``path`` (dot-separated keys and list indices,
    e.g. ``build.status``) equals ``equals`` (or merely exists when ``equals`` is None), and
    the body (the value at ``path`` when it is a string and a path is given) contains
    ``contains``. Neither: any event on the hook."""

    path: str | None = None
    equals: Any = None
    contains: str | None = None

    def describe(self, hook: str) -> str:
        parts = [f"an event on hook {hook}"]
        if self.path is not None:
            if self.equals is None:
                parts.append(f"with {self.path} present")
            else:
                parts.append(f"with {self.path} == {json.dumps(self.equals)}")
        if self.contains is not None:
            parts.append(f"containing {json.dumps(self.contains)}")
        return " ".join(parts)

    def as_dict(self) -> MatchSpec:
        return {"path": self.path, "equals": self.equals, "contains": self.contains}

    @classmethod
    def from_dict(cls, raw: Any) -> WaitMatch:
        if not isinstance(raw, Mapping):
            return cls()
        path, contains = raw.get("path"), raw.get("contains")
        return cls(
            path if isinstance(path, str) else None,
            raw.get("equals"),
            contains if isinstance(contains, str) else None,
        )

    def holds(self, body: str) -> bool:
        """Whether an event with this body (JSON text) is what the wait waits for; a body
        that does not parse, or nests too deep to read, never matches a path."""
        target: Any = body
        if self.path is not None:
            try:
                value = _at_path(json.loads(body), self.path)
            except (ValueError, RecursionError):
                return False
            if value is _MISSING:
                return False
            if self.equals is not None and not _same(value, self.equals):
                return False
            target = value if isinstance(value, str) else body
        return self.contains is None or self.contains in target


_MISSING = object()


def _at_path(doc: Any, path: str) -> Any:
    for part in path.split("."):
        if isinstance(doc, dict) and part in doc:
            doc = doc[part]
        elif (
            isinstance(doc, list)
            and part.lstrip("-").isdigit()
            and -len(doc) <= int(part) < len(doc)
        ):
            doc = doc[int(part)]
        else:
            return _MISSING
    return doc


def _same(value: Any, wanted: Any) -> bool:
    # JSON numbers compare by value (1 == 1.0) but a boolean is never a number.
    if isinstance(value, bool) or isinstance(wanted, bool):
        return type(value) is type(wanted) and value == wanted
    return bool(value == wanted)


@dataclass(frozen=True, slots=True)
class WaitOrigin:
    """The conversation a wait wakes (the routing fields every ledger row carries)."""

    session_key: str | None = None
    origin_session_id: str | None = None
    origin_ui_session_id: str | None = None


def routed_row_id(hook: str, webhook_id: str) -> str:
    """The ledger id of an event's wake-up in its hook's conversation: derived, so routing
    the same event twice can only write it once."""
    digest = hashlib.sha256(f"{hook}\0{webhook_id}".encode()).hexdigest()[:32]
    return f"inb_{digest}"


def _event_fields(event: HookEvent) -> EventFields:
    return {
        "hook": event.hook,
        "webhook_id": event.webhook_id,
        "received_at": event.received_at,
        "payload": event.body,
    }


def receive(store: HookBackend, ledger: Ledger, route: HookRoute, event: HookEvent) -> Receipt:
    """Store ``event``, route it to the hook's conversation and fire the waits it matches
    (blocking store work: call it in a thread). Raises when the store cannot be written:
    the sender then gets no 2xx and posts again."""
    first = store.record_event(event)
    stored = first or event
    routed: str | None = None
    if route.session:
        routed = routed_row_id(stored.hook, stored.webhook_id)
        wake = {
            "type": INBOUND_EVENT,
            "delivery_id": routed,
            "status": "completed",
            "outcome": "event",
            **_event_fields(stored),
            "origin_session_id": route.session,
            "dispatched_at": stored.received_at,
            "completed_at": stored.received_at,
            "due_at": stored.received_at,
        }
        # A re-post after a crash between the store and the 2xx: routed when it first came.
        with contextlib.suppress(DuplicateDeliveryError):
            ledger.schedule(
                routed,
                kind=INBOUND_KIND,
                event=wake,
                not_before=ledger.clock(),
                origin_session_id=route.session,
                goal=f"inbound event {stored.webhook_id} on hook {stored.hook}",
            )
    fired = tuple(_fire_waits(ledger, stored, repost=first is not None))
    return Receipt(first is not None, routed, fired)


def _open_waits(ledger: Ledger, hook: str) -> list[LedgerRow]:
    # By the indexed hook column: the open waits on other hooks are never read.
    query = RowQuery(kind=WAIT_KIND, delivery_state="pending", hook=hook, limit=OPEN_WAITS_LIMIT)
    return [
        r
        for r in ledger.query(query)
        if isinstance(r.event, dict)
        and r.event.get("outcome") == "expired"  # not brought forward yet
        and r.claim_token is None
    ]


def _fire_waits(ledger: Ledger, event: HookEvent, *, repost: bool) -> list[str]:
    fired: list[str] = []
    for row in sorted(_open_waits(ledger, event.hook), key=lambda r: (r.created_at, r.id)):
        assert isinstance(row.event, dict)
        # A re-post fires only waits that were open when the event first came (its first
        # post may have died before it got to them): a wait set later looked back at the
        # stored event itself. A new event fires every open wait, even one stamped after
        # it, which may have looked back before the event was stored.
        if repost and row.created_at > event.received_at:
            continue
        if _fire(ledger, row.id, row.event, event):
            fired.append(row.id)
    return fired


def _fire(ledger: Ledger, row_id: str, wait_event: Mapping[str, object], event: HookEvent) -> bool:
    match = WaitMatch.from_dict(wait_event.get("match_spec"))
    if not match.holds(event.body):
        return False
    now = ledger.clock()
    matched = {
        **wait_event,
        "status": "completed",
        "outcome": "matched",
        **_event_fields(event),
        "completed_at": now,
        "due_at": now,
    }
    return ledger.bring_forward(row_id, matched)


def set_wait(
    store: HookBackend,
    ledger: Ledger,
    *,
    hook: str,
    match: WaitMatch,
    note: str,
    lifetime_seconds: float,
    lookback_seconds: float,
    origin: WaitOrigin,
) -> tuple[str, HookEvent | None]:
    """Write a wait and look back for its event (blocking store work: call it in a thread);
    returns the wait's ledger id and the stored event that fired it at once (None: it waits).
    """
    now = ledger.clock()
    row_id = new_id("ww_")
    expires = now + lifetime_seconds
    expired = {
        "type": INBOUND_EVENT,
        "delivery_id": row_id,
        "status": "expired",
        "outcome": "expired",
        "hook": hook,
        "match": match.describe(hook),
        "match_spec": match.as_dict(),
        "note": note,
        "due_at": expires,
        "session_key": origin.session_key,
        "origin_session_id": origin.origin_session_id,
        "origin_ui_session_id": origin.origin_ui_session_id,
        "dispatched_at": now,
        "completed_at": expires,
    }
    ledger.schedule(
        row_id,
        kind=WAIT_KIND,
        event=expired,
        not_before=expires,
        session_key=origin.session_key,
        origin_session_id=origin.origin_session_id,
        origin_ui_session_id=origin.origin_ui_session_id,
        goal=note,
        hook=hook,
    )
    for event in _lookback(store, hook, now - lookback_seconds):
        if _fire(ledger, row_id, expired, event):
            return row_id, event
        if not _still_open(ledger, row_id):
            return row_id, None  # an arriving event fired it meanwhile
    return row_id, None


def _lookback(store: HookBackend, hook: str, since: float) -> Sequence[HookEvent]:
    return store.events_since(hook, since, LOOKBACK_LIMIT)


def _still_open(ledger: Ledger, row_id: str) -> bool:
    row = ledger.get(row_id)
    return (
        row is not None
        and isinstance(row.event, dict)
        and row.event.get("outcome") == "expired"
        and row.delivery_state == "pending"
    )
