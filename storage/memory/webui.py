"""The web UI's state in this process's memory (``delivery.webui_state``): for tests and
embedding, where no other server shares it. Every operation runs under one lock."""

from __future__ import annotations

import itertools
import threading
from typing import TYPE_CHECKING

from delivery.notifier import Notifier
from delivery.webui_state import StoredEvent, ToolStep, WebUIStateBackend
from storage.pokes import LocalNotifier

__all__ = ["MemoryWebUIState"]


class MemoryWebUIState:
    """``WebUIStateBackend`` in memory (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._notifier = LocalNotifier()
        self._events: list[StoredEvent] = []
        self._newest = 0
        self._appended_at: dict[int, float] = {}
        self._unread: dict[str, bool] = {}
        self._steps: list[tuple[str, str, ToolStep]] = []  # (session, turn, step)
        self._step_ids = itertools.count(1)
        self._settings: dict[str, str] = {}

    @property
    def notifier(self) -> Notifier:
        return self._notifier

    def close(self) -> None:
        pass

    def append_event(self, type_: str, data_json: str, created_at: float) -> int:
        with self._lock:
            self._newest += 1
            self._events.append(StoredEvent(self._newest, type_, data_json))
            self._appended_at[self._newest] = created_at
            return self._newest

    def events_after(self, after_id: int, limit: int) -> list[StoredEvent]:
        with self._lock:
            return [e for e in self._events if e.id > after_id][:limit]

    def oldest_event_id(self) -> int | None:
        with self._lock:
            return self._events[0].id if self._events else None

    def newest_event_id(self) -> int:
        with self._lock:
            return self._newest

    def prune_events(self, keep: int) -> None:
        with self._lock:
            self._events = [e for e in self._events if e.id > self._newest - keep]
            kept = {e.id for e in self._events}
            self._appended_at = {i: at for i, at in self._appended_at.items() if i in kept}

    def prune_events_before(self, before: float, limit: int, *, dry_run: bool = False) -> int:
        with self._lock:
            old = {e.id for e in self._events if self._appended_at[e.id] < before}
            old = set(sorted(old)[: max(int(limit), 0)])
            if not dry_run:
                self._events = [e for e in self._events if e.id not in old]
                for event_id in old:
                    del self._appended_at[event_id]
            return len(old)

    def set_unread(self, session_id: str, unread: bool) -> None:
        with self._lock:
            self._unread[session_id] = unread

    def unread_ids(self) -> set[str]:
        with self._lock:
            return {sid for sid, unread in self._unread.items() if unread}

    def add_tool_step(
        self, session_id: str, turn_id: str, name: str, status: str, summary: str, at: float
    ) -> None:
        with self._lock:
            step = ToolStep(next(self._step_ids), None, name, status, summary)
            self._steps.append((session_id, turn_id, step))

    def place_tool_steps(self, turn_id: str, message_id: int | None) -> None:
        with self._lock:
            kept = []
            for sid, turn, step in self._steps:
                if turn == turn_id:
                    if message_id is None:
                        continue
                    step = ToolStep(step.id, message_id, step.name, step.status, step.summary)
                kept.append((sid, turn, step))
            self._steps = kept

    def tool_steps(self, session_id: str, limit: int) -> list[ToolStep]:
        with self._lock:
            mine = [step for sid, _, step in self._steps if sid == session_id]
            return mine[len(mine) - limit :] if limit else []

    def setting(self, name: str) -> str | None:
        with self._lock:
            return self._settings.get(name)

    def set_setting(self, name: str, value: str) -> None:
        with self._lock:
            self._settings[name] = value

    def setting_or_default(self, name: str, default: str) -> str:
        with self._lock:
            return self._settings.setdefault(name, default)


# mypy proves the backend keeps the protocol, without importing it at run time.
if TYPE_CHECKING:
    _conforms: type[WebUIStateBackend] = MemoryWebUIState
