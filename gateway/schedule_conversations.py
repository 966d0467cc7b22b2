"""A conversation of its own for a schedule (``target: "own"``): a new session on the surface
of the conversation that asked, titled after the schedule's note, that the user can open and
continue like any other (a web UI session in the sidebar; an API session by its id). Its
occurrences are routed there instead of to the asking conversation.

Chat platforms (Telegram, Discord) have one conversation per chat and no way to show a second
one: they refuse it, so the schedule tool says so instead of routing occurrences nowhere.
"""

from __future__ import annotations

from collections.abc import Callable

from delivery.schedules import Origin, ScheduleError
from gateway.config import Platform
from gateway.delivery_targets import session_platform
from gateway.session import (
    SessionSource,
    SessionStore,
    build_session_key,
    new_session_id,
    title_from_text,
)

__all__ = ["conversation_opener"]


def conversation_opener(store: SessionStore) -> Callable[[Origin, str], Origin]:
    """``ScheduleEngine``'s ``open_conversation`` over the session store (blocking)."""

    def open_conversation(asking: Origin, note: str) -> Origin:
        title = title_from_text(f"Schedule: {note}")
        if asking.origin_ui_session_id is not None:
            session_id = new_session_id()
            source = SessionSource(platform=Platform.WEBUI, chat_id=session_id)
            store.create_session(session_id, source=source, title=title)
            return _origin(session_id, Platform.WEBUI)
        if asking.origin_session_id is not None:
            record = store.get_session(asking.origin_session_id)
            if record is not None and session_platform(record) is Platform.API_SERVER:
                made = store.create_session(title=title)
                return _origin(made.id, Platform.API_SERVER)
        raise ScheduleError(
            "a conversation of its own is available to API and web UI conversations only; "
            "use target 'this' here"
        )

    return open_conversation


def _origin(session_id: str, platform: Platform) -> Origin:
    """Routed as that surface's own turns route their background work (the web UI names its
    session as both the origin and the web UI origin)."""
    key = build_session_key(SessionSource(platform=platform, chat_id=session_id))
    if platform is Platform.WEBUI:
        return Origin(key, session_id, session_id)
    return Origin(key, session_id, None)
