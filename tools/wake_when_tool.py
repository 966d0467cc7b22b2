"""The `wake_when` tool: the agent waits for an inbound event (``POST /v1/hooks/{name}``) on a
hook, spending nothing until it comes.

A wait is a ledger row written at once, due at the end of its lifetime with an ``expired``
completion (the conversation is told, never left in silence); an event that matches brings
it forward with the event in place (``delivery.inbound``), so it fires exactly once, matched
or expired, on whichever server shares the store, across restarts. It looks back over the
hook's events of the last ``[hooks] lookback_seconds`` when it is set, so an event that came
just before the wait (the CI finished while the agent was still talking) is not missed.

The match: ``path`` (dot-separated keys and list indices into the event's JSON) equal to
``equals`` (or merely present), and/or the body containing ``contains``; neither is any
event on the hook. Offered to sub-agents only when their dispatch names the ``timers``
toolset, like ``schedule_wakeup``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial

from agent.messages import JSONObject
from agent.tool_args import required_note
from agent.tools import Tool, ToolContext
from delivery.events import WAIT_KIND
from delivery.inbound import Inbox, WaitMatch, WaitOrigin, set_wait
from tools.wakeup_tool import (
    MAX_NOTE_CHARS,
    WAKEUP_TOOLSET,
    iso_utc,
    pending_cap_error,
    set_parsed,
)

__all__ = [
    "DEFAULT_LIFETIME_SECONDS",
    "MAX_LIFETIME_SECONDS",
    "MIN_LIFETIME_SECONDS",
    "WaitRequest",
    "install_inbox",
    "installed_inbox",
    "make_wake_when_tool",
    "parse_wait",
]

MIN_LIFETIME_SECONDS = 10.0
DEFAULT_LIFETIME_SECONDS = 86400.0
MAX_LIFETIME_SECONDS = 30 * 86400.0
_MAX_PATH = 200
_MAX_CONTAINS = 1000

PARAMETERS: JSONObject = {
    "type": "object",
    "properties": {
        "hook": {"type": "string", "description": "The hook's name (POST /v1/hooks/{name})."},
        "note": {
            "type": "string",
            "description": "What to do when the event comes; it is restated to you then.",
        },
        "path": {
            "type": "string",
            "description": "A dot-separated path into the event's JSON, e.g. build.status or "
            "items.0.id; with equals, the value there must equal it, else merely exist.",
        },
        "equals": {
            "description": "The value at path to wait for (a string, number or boolean).",
        },
        "contains": {
            "type": "string",
            "description": "Text the event's body (or the string at path) must contain.",
        },
        "lifetime_seconds": {
            "type": "number",
            "description": "Give up after this many seconds (10 to 2592000, default 86400); "
            "you are woken then with 'expired'.",
        },
    },
    "required": ["hook", "note"],
}

DESCRIPTION = (
    "Wake this conversation when an inbound event arrives on a hook (POST /v1/hooks/{name}), "
    "optionally only one whose JSON has path == equals or whose body contains a text. "
    "Costs nothing while waiting; an event that arrived shortly before you asked also "
    "counts. You are woken once: with the event, or with 'expired' after lifetime_seconds."
)


class WaitError(ValueError):
    """Arguments a wait cannot be set with; the message says what to give instead."""


@dataclass(frozen=True, slots=True)
class WaitRequest:
    """A valid wait: the hook, the match, the note and the lifetime."""

    hook: str
    match: WaitMatch
    note: str
    lifetime_seconds: float


def parse_wait(args: Mapping[str, object], hooks: frozenset[str]) -> WaitRequest:
    """The wait ``args`` ask for, or WaitError saying what is wrong."""
    hook = args.get("hook")
    if not isinstance(hook, str) or hook not in hooks:
        known = ", ".join(sorted(hooks)) or "none"
        raise WaitError(f"hook must be one of this server's hooks ({known})")
    note = required_note(
        args.get("note"),
        purpose="what to do when the event comes",
        max_chars=MAX_NOTE_CHARS,
        error=WaitError,
    )
    path, contains, equals = args.get("path"), args.get("contains"), args.get("equals")
    if path is not None and (not isinstance(path, str) or not path or len(path) > _MAX_PATH):
        raise WaitError(f"path must be a dot-separated path of 1-{_MAX_PATH} characters")
    if equals is not None:
        if path is None:
            raise WaitError("equals needs a path: the value at path must equal it")
        if not isinstance(equals, str | int | float | bool) or (
            isinstance(equals, float) and not math.isfinite(equals)
        ):
            raise WaitError("equals must be a string, a number or a boolean")
    if contains is not None and (
        not isinstance(contains, str) or not contains or len(contains) > _MAX_CONTAINS
    ):
        raise WaitError(f"contains must be a text of 1-{_MAX_CONTAINS} characters")
    lifetime = args.get("lifetime_seconds", DEFAULT_LIFETIME_SECONDS)
    if isinstance(lifetime, str):
        try:
            lifetime = float(lifetime)
        except ValueError:
            lifetime = None
    if (
        not isinstance(lifetime, int | float)
        or isinstance(lifetime, bool)
        or not math.isfinite(lifetime)
        or not MIN_LIFETIME_SECONDS <= lifetime <= MAX_LIFETIME_SECONDS
    ):
        raise WaitError(
            f"lifetime_seconds must be a number from {MIN_LIFETIME_SECONDS:g} to "
            f"{MAX_LIFETIME_SECONDS:g} (30 days)"
        )
    return WaitRequest(hook, WaitMatch(path, equals, contains), note, float(lifetime))


def _set(inbox: Inbox, ctx: ToolContext, wanted: WaitRequest) -> JSONObject:
    """Write the wait and look back (blocking store work: run in a thread)."""
    from tools.delegation_runtime import get_runtime

    ledger = get_runtime().ledger
    if refused := pending_cap_error(ledger, ctx, WAIT_KIND, "waits", "let one fire"):
        return refused
    origin = WaitOrigin(ctx.session_key, ctx.session_id, ctx.origin_ui_session_id)
    wait_id, found = set_wait(
        inbox.store,
        ledger,
        hook=wanted.hook,
        match=wanted.match,
        note=wanted.note,
        lifetime_seconds=wanted.lifetime_seconds,
        lookback_seconds=inbox.lookback_seconds,
        origin=origin,
    )
    waiting_for = wanted.match.describe(wanted.hook)
    if found is not None:
        return {
            "status": "fired",
            "wait_id": wait_id,
            "waiting_for": waiting_for,
            "event_id": found.webhook_id,
            "received_at": iso_utc(found.received_at),
            "message": "a matching event had already come; it is delivered to you as a wake-up",
        }
    return {
        "status": "waiting",
        "wait_id": wait_id,
        "waiting_for": waiting_for,
        "expires_at": iso_utc(ledger.clock() + wanted.lifetime_seconds),
    }


def make_wake_when_tool(inbox: Callable[[], Inbox | None]) -> Tool:
    """`wake_when`, in the ``timers`` toolset; ``inbox`` gives the hook store and the
    declared hooks at call time (None: this process serves no hooks)."""

    async def handler(args: JSONObject, ctx: ToolContext) -> JSONObject:
        current = inbox()
        if current is None or not current.routes:
            return {"error": "this server has no hooks: declare one with [hooks.NAME]"}
        return await set_parsed(
            ctx,
            partial(parse_wait, args, frozenset(current.routes)),
            WaitError,
            partial(_set, current, ctx),
        )

    return Tool(
        name="wake_when",
        description=DESCRIPTION,
        parameters=PARAMETERS,
        handler=handler,
        toolset=WAKEUP_TOOLSET,
    )


_installed: Inbox | None = None


def install_inbox(inbox: Inbox | None) -> None:
    """The composition root hands the process's inbox to the tools it built (like the
    delegation runtime): a tool built before the store was opened finds it at call time."""
    global _installed
    _installed = inbox


def installed_inbox() -> Inbox | None:
    return _installed
