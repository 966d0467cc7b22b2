"""The web UI's durable event log: every event of the browser's stream, with an increasing id.

The log lives in the shared store, behind ``delivery.webui_state`` (``webui.db`` beside the
ledger with SQLite, tables of the database with PostgreSQL), so every server sharing the
store shares it. Backend calls run on one worker thread of their own, in order, never on
the event loop. Events reach the live subscribers (one bounded queue per open stream) in id
order, whichever server appended them: an append pokes the other servers (the backend's
notifier) and each server's tail reads what it has not published yet; ids grow in commit
order, so a tail never skips one. A replay reads from storage a page at a time
(``can_replay``, then ``page_after``), so a tab reconnecting behind a long log never has
the whole of it in memory; an id older than what is kept (the log is pruned to its newest
``keep`` events), newer than any written, or too far behind, cannot be replayed, and the
stream sends ``reset``. The same state keeps the durable unread marks of
sessions, the finished tool steps of turns (shown in their place in the transcript), the
login epoch and the secret the login cookie is signed with (in the store, so that a login
is good on every server sharing it; the key is bound to the password all the same).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from agent.messages import JSONObject
from delivery.notifier import Subscription as Pokes
from delivery.webui_state import StoredEvent, ToolStep, WebUIStateBackend

__all__ = ["EventLog", "LoggedEvent", "Subscription", "TooManyStreams", "ToolStep"]

T = TypeVar("T")
logger = logging.getLogger(__name__)

_PRUNE_EVERY = 500
_QUEUE_BOUND = 2000
_TAIL_BATCH = 200  # events the tail reads at a time (what it holds in memory at once)


@dataclass(frozen=True, slots=True)
class LoggedEvent:
    """One event as the stream sends it."""

    id: int
    type: str
    data: JSONObject

    def sse(self) -> bytes:
        """The event in Server-Sent-Events framing (JSON data: never live HTML)."""
        payload = json.dumps(self.data, ensure_ascii=False, separators=(",", ":"))
        return f"id: {self.id}\nevent: {self.type}\ndata: {payload}\n\n".encode()


@dataclass(eq=False)
class Subscription:
    """A live stream's queue; ``None`` in it means "end now" (overflow, too many tabs of its
    owner, or shutdown). ``owner`` is who opened it (a login, or a client address)."""

    owner: str = ""
    queue: asyncio.Queue[LoggedEvent | None] = field(
        default_factory=lambda: asyncio.Queue(_QUEUE_BOUND)
    )


class TooManyStreams(Exception):
    """Every stream the server allows is open: the caller answers 429 with Retry-After."""


class EventLog:
    """Append, replay and publish web UI events; keep unread marks (see the module docstring)."""

    def __init__(
        self,
        backend: WebUIStateBackend,
        *,
        keep: int = 20000,
        max_streams: int = 256,
        max_streams_per_owner: int = 32,
    ) -> None:
        self.backend = backend
        self.keep = keep
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="webui-event-log")
        # Bounds on open streams: each holds a connection and a queue, so an unbounded number
        # would let one client exhaust the server's descriptors.
        self.max_streams = max_streams
        self.max_streams_per_owner = max_streams_per_owner
        # Insertion-ordered (a dict as an ordered set): the oldest stream comes first.
        self._subscribers: dict[Subscription, None] = {}
        self._appended = 0
        self._pokes: Pokes | None = None
        # The tail: the newest id published to this server's streams, and what wakes it.
        self._published = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._more = asyncio.Event()
        self._tail: asyncio.Task[None] | None = None
        self._watchers: list[Callable[[LoggedEvent], None]] = []

    # ----------------------------------------------------------------- lifecycle

    async def aopen(self) -> None:
        """Start publishing every server's events to this server's streams."""
        self._published = await self.latest_id()
        self._loop = asyncio.get_running_loop()
        self._pokes = await self._run(self.backend.notifier.subscribe)
        if self._pokes is not None:
            self._loop.add_reader(self._pokes.fileno(), self._poked)
        self._tail = asyncio.create_task(self._follow_tail())

    async def aclose(self) -> None:
        self._detach()
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        """End every stream and close the backend (this log owns it)."""
        self._detach()
        self.end_streams()
        self._writer.shutdown(wait=True)
        self.backend.close()

    def _detach(self) -> None:
        """Stop the tail (on the loop's thread: ``aclose``, or ``close`` called there)."""
        if self._tail is not None:
            self._tail.cancel()
            self._tail = None
        if self._pokes is not None:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._pokes.fileno())
            self._pokes.close()
            self._pokes = None

    async def _run(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._writer, fn)

    # ----------------------------------------------------------------- events

    async def append(self, type_: str, data: Mapping[str, object]) -> LoggedEvent:
        """Write the event and publish it to every live stream of every server; returns it
        with its id."""
        text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str)
        event_id = await self._run(lambda: self._insert(type_, text))
        event = LoggedEvent(event_id, type_, json.loads(text))
        if event_id <= self._published:
            # The log started again (its file was deleted and made anew): every tab
            # reconnects, is told to reset, and follows the new ids from here.
            self._published = event_id - 1
            self.end_streams()
        if event_id == self._published + 1:
            self._publish(event)  # nothing between: no read needed
        else:
            self._more.set()  # another server's events come first: the tail reads them
        return event

    def _insert(self, type_: str, text: str) -> int:
        event_id = self.backend.append_event(type_, text, time.time())
        self._appended += 1
        if self._appended % _PRUNE_EVERY == 0:
            self.backend.prune_events(self.keep)
        self.backend.notifier.notify()  # committed: the other servers may read it
        return event_id

    def watch(self, watcher: Callable[[LoggedEvent], None]) -> None:
        """Be told of every event this server publishes, its own and other servers' (on the
        event loop, in id order): how a server acts on what a tab asked another server."""
        self._watchers.append(watcher)

    def _publish(self, event: LoggedEvent) -> None:
        self._published = event.id
        for watcher in self._watchers:
            try:
                watcher(event)
            except Exception:
                logger.exception("a watcher of the event log failed on %s", event.type)
        for sub in list(self._subscribers):
            try:
                sub.queue.put_nowait(event)
            except asyncio.QueueFull:
                # A stream that cannot keep up ends; its tab reconnects and replays.
                self._end(sub)

    def _poked(self) -> None:
        if self._pokes is not None:
            self._pokes.drain()
        self._more.set()

    async def _follow_tail(self) -> None:
        """Publish, in id order, the events this server has not published yet (another
        server's, or ones that overtook a local append)."""
        while True:
            await self._more.wait()
            self._more.clear()
            try:
                events = await self._run(
                    lambda: self.backend.events_after(self._published, _TAIL_BATCH)
                )
            except Exception as exc:
                logger.warning("could not read the web UI event log: %s", exc)
                await asyncio.sleep(0.5)
                self._more.set()
                continue
            for stored in events:
                if stored.id > self._published:
                    self._publish(_logged(stored))
            if len(events) == _TAIL_BATCH:
                self._more.set()  # more behind these

    async def since(self, after_id: int, limit: int = 5000) -> list[LoggedEvent] | None:
        """Events after ``after_id`` in order; None when that id cannot be replayed."""
        return await self._run(lambda: self._since(after_id, limit))

    def _since(self, after_id: int, limit: int) -> list[LoggedEvent] | None:
        newest = self.backend.newest_event_id()
        if after_id > newest or after_id < 0:
            return None
        oldest = self.backend.oldest_event_id()
        if after_id < newest and (oldest is None or after_id < oldest - 1):
            return None  # pruned past it
        stored = self.backend.events_after(after_id, limit + 1)
        if len(stored) > limit:
            return None  # too much missed: refetching is cheaper
        return [_logged(e) for e in stored]

    async def can_replay(self, after_id: int, limit: int) -> bool:
        """Whether the events after ``after_id`` can be replayed: still kept, and at most
        ``limit`` of them (ids are unique and increasing, so the newest id less
        ``after_id`` bounds their number)."""

        def check() -> bool:
            newest = self.backend.newest_event_id()
            if after_id > newest or after_id < 0:
                return False
            oldest = self.backend.oldest_event_id()
            if after_id < newest and (oldest is None or after_id < oldest - 1):
                return False  # pruned past it
            return newest - after_id <= limit

        return await self._run(check)

    async def page_after(self, after_id: int, size: int) -> list[LoggedEvent]:
        """At most ``size`` events after ``after_id``, in order: one page of a replay."""
        return await self._run(
            lambda: [_logged(e) for e in self.backend.events_after(after_id, size)]
        )

    async def latest_id(self) -> int:
        return await self._run(self.backend.newest_event_id)

    @property
    def open_streams(self) -> int:
        return len(self._subscribers)

    def subscribe(self, owner: str = "") -> Subscription:
        """A new live stream of ``owner``. An owner at its limit of open streams (a login
        with too many tabs) has its oldest stream ended to make room; with every stream of
        the server open, TooManyStreams."""
        mine = [s for s in self._subscribers if s.owner == owner]
        if len(mine) >= self.max_streams_per_owner:
            self._end(mine[0])
        elif len(self._subscribers) >= self.max_streams:
            raise TooManyStreams(f"{len(self._subscribers)} event streams are open")
        sub = Subscription(owner)
        self._subscribers[sub] = None
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        self._subscribers.pop(sub, None)

    def end_streams(self) -> None:
        """End every live stream (shutdown): each tab reconnects and replays."""
        for sub in list(self._subscribers):
            self._end(sub)

    def _end(self, sub: Subscription) -> None:
        self._subscribers.pop(sub, None)
        while True:
            try:
                sub.queue.put_nowait(None)
                return
            except asyncio.QueueFull:
                sub.queue.get_nowait()

    # ----------------------------------------------------------------- unread marks

    async def set_unread(self, session_id: str, unread: bool) -> None:
        await self._run(lambda: self.backend.set_unread(session_id, unread))

    async def unread_ids(self) -> set[str]:
        return await self._run(self.backend.unread_ids)

    # ----------------------------------------------------------------- tool steps

    async def add_tool_step(
        self, session_id: str, turn_id: str, *, name: str, status: str, summary: str
    ) -> None:
        await self._run(
            lambda: self.backend.add_tool_step(
                session_id, turn_id, name, status, summary, time.time()
            )
        )

    async def place_tool_steps(self, turn_id: str, message_id: int | None) -> None:
        """Pin a finished turn's steps before its stored reply; None (the turn stored
        nothing) forgets them."""
        await self._run(lambda: self.backend.place_tool_steps(turn_id, message_id))

    async def tool_steps(self, session_id: str, limit: int = 2000) -> list[ToolStep]:
        return await self._run(lambda: self.backend.tool_steps(session_id, limit))

    # ----------------------------------------------------------------- the cookie secret

    async def secret(self) -> bytes:
        """The signing secret of every server sharing the store, made once (a restart
        keeps logins)."""
        made = await self._run(
            lambda: self.backend.setting_or_default("cookie_secret", secrets.token_hex(32))
        )
        return bytes.fromhex(made)

    async def login_epoch(self) -> int:
        """The web UI's login epoch: cookies of another epoch are logged out."""
        return int(await self._run(lambda: self.backend.setting("login_epoch")) or 0)

    async def next_login_epoch(self) -> int:
        """Move the login epoch on (a logout), durably; returns the new one."""

        def bump() -> int:
            epoch = int(self.backend.setting("login_epoch") or 0) + 1
            self.backend.set_setting("login_epoch", str(epoch))
            return epoch

        return await self._run(bump)


def _logged(stored: StoredEvent) -> LoggedEvent:
    return LoggedEvent(stored.id, stored.type, json.loads(stored.data_json))
