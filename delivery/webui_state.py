"""The storage seam of the web UI's state: its event log, unread marks, finished tool steps
and settings, shared by every server on one store.

``api.event_log.EventLog`` is the face the web UI uses; it speaks this protocol to a
backend opened by ``storage.open_storage(url).open_webui()`` (a SQLite file beside the
ledger, or tables in the PostgreSQL database). The rules every backend keeps, proved by
``tests/webui/test_state_backends.py``:

* Event ids grow in commit order across every server sharing the state, so a reader that
  has seen id N and reads "after N" never skips an event committed later with a smaller id.
* ``newest_event_id`` is the newest id ever handed out, even when the events up to it were
  pruned (a tab that saw it is told to reset, not to wait for it).
* ``notifier`` pokes every server sharing the state (a unix socket directory beside the
  SQLite file; ``LISTEN/NOTIFY`` on PostgreSQL); an append does not poke by itself.

Methods block: callers run them on a thread of their own (the event log's writer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from delivery.notifier import Notifier

__all__ = ["StoredEvent", "ToolStep", "WebUIStateBackend"]


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One event of the log, its data as the JSON text it was stored as."""

    id: int
    type: str
    data_json: str


@dataclass(frozen=True, slots=True)
class ToolStep:
    """A finished tool step of a session's turn (the transcript stores only the text)."""

    id: int
    message_id: int | None
    """The reply of its turn (the step is shown right before it); None while it runs."""
    name: str
    status: str
    summary: str

    @classmethod
    def of_row(cls, row: Any) -> ToolStep:
        """From a stored row: id, message_id, name, status, summary (every SQL backend)."""
        step_id, message_id, name, status, summary = row
        return cls(
            int(step_id),
            None if message_id is None else int(message_id),
            str(name),
            str(status),
            str(summary),
        )


class WebUIStateBackend(Protocol):
    """The web UI's shared state (see the module docstring)."""

    @property
    def notifier(self) -> Notifier: ...

    # -- the event log
    def append_event(self, type_: str, data_json: str, created_at: float) -> int:
        """Store an event; its id."""

    def events_after(self, after_id: int, limit: int) -> list[StoredEvent]:
        """Events with ids > ``after_id``, in order, at most ``limit``."""

    def oldest_event_id(self) -> int | None:
        """The oldest event kept, or None when none is."""

    def newest_event_id(self) -> int:
        """The newest id ever handed out (0 before the first)."""

    def prune_events(self, keep: int) -> None:
        """Forget all but the newest ``keep`` events."""

    def prune_events_before(self, before: float, limit: int, *, dry_run: bool = False) -> int:
        """Forget at most ``limit`` events appended before ``before``, oldest first (with
        ``dry_run`` only count them); how many. ``newest_event_id`` is unchanged."""

    # -- unread marks
    def set_unread(self, session_id: str, unread: bool) -> None: ...

    def unread_ids(self) -> set[str]: ...

    # -- finished tool steps
    def add_tool_step(
        self, session_id: str, turn_id: str, name: str, status: str, summary: str, at: float
    ) -> None: ...

    def place_tool_steps(self, turn_id: str, message_id: int | None) -> None:
        """Pin a turn's steps before its stored reply; None forgets them."""

    def tool_steps(self, session_id: str, limit: int) -> list[ToolStep]:
        """The session's newest ``limit`` steps, oldest first."""

    # -- settings of the web UI (the login epoch, the cookie secret)
    def setting(self, name: str) -> str | None: ...

    def set_setting(self, name: str, value: str) -> None: ...

    def setting_or_default(self, name: str, default: str) -> str:
        """The setting, stored as ``default`` first when it has none (one winner when
        several servers race to make it)."""

    def close(self) -> None: ...
