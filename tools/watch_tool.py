"""The `watch` tool: wake this conversation when a background process's output matches a
pattern, or when a command run at an interval exits 0, spending no model tokens until then.

Actions: ``create`` (the default), ``list`` (this conversation's running watches) and
``cancel``. The watching itself is ``tools.watches`` (rows in the store, followed by a
thread); its bounds and the pattern guard are ``tools.watch_rules``. A command watch runs
only where the shell tool is enabled, and asks for approval like the shell tool does.
It sits in the ``timers`` toolset beside `schedule_wakeup`: a sub-agent gets it only when
its dispatch names that toolset.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from agent.messages import JSONObject
from agent.tools import ApprovalExpired, Tool, ToolContext
from delivery.events import WATCH_KIND
from delivery.ids import new_id
from delivery.rows import LedgerRow, RowQuery
from delivery.states import State
from tools.shell_tool import DENIED_ERROR, EXPIRED_ERROR, NO_APPROVAL_ERROR, SHELL_DISABLED_ERROR
from tools.wakeup_tool import WAKEUP_TOOLSET
from tools.watch_rules import (
    COMMAND,
    MAX_FIRES,
    MAX_LINE_CHARS,
    MIN_INTERVAL_SECONDS,
    WatchError,
    WatchOrigin,
    WatchSpec,
    parse_watch,
)

if TYPE_CHECKING:  # the watching machinery loads when a watch is first set
    from tools.watches import WatchManager

__all__ = ["MAX_WATCHES_PER_SESSION", "make_watch_tool"]

MAX_WATCHES_PER_SESSION = 20

PARAMETERS: JSONObject = {
    "type": "object",
    "properties": {
        "action": {
            "type": "string",
            "enum": ["create", "list", "cancel"],
            "description": "create (default), list this conversation's watches, or cancel one.",
        },
        "note": {"type": "string", "description": "What to do when it fires; restated then."},
        "process_id": {
            "type": "string",
            "description": "A background process (proc_... from terminal) whose output to watch.",
        },
        "pattern": {
            "type": "string",
            "description": "Regular expression a line of that output must match (no nested "
            "repeats or backreferences; lines are matched on their first "
            f"{MAX_LINE_CHARS} characters).",
        },
        "command": {
            "type": "string",
            "description": "A shell command run every interval_seconds; it fires when it exits 0.",
        },
        "interval_seconds": {"type": "number", "description": "Between command runs."},
        "timeout_seconds": {"type": "number", "description": "Bound on each command run."},
        "cooldown_seconds": {
            "type": "number",
            "description": "After a firing, matches are ignored this long (default 60).",
        },
        "lifetime_seconds": {
            "type": "number",
            "description": "It expires after this long (default 3600, at most 7 days); "
            "you are told when it expires.",
        },
        "max_fires": {
            "type": "integer",
            "description": f"It ends after this many firings (default 1, at most {MAX_FIRES}).",
        },
        "watch_id": {"type": "string", "description": "With cancel: the watch to cancel."},
    },
}

DESCRIPTION = (
    "Wake this conversation when something happens, at no cost until it does: when a "
    "line of a background process's output matches a pattern (process_id + pattern), or "
    "when a command run every interval_seconds exits 0 (command). Each watch has a note, "
    "a cooldown, a lifetime (you are told when it expires) and max_fires. action=list "
    "shows this conversation's watches; action=cancel with watch_id stops one."
)


def _session(ctx: ToolContext) -> str | None:
    return ctx.origin_ui_session_id or ctx.session_id or ctx.session_key


def _mine(row: LedgerRow, ctx: ToolContext) -> bool:
    session = _session(ctx)
    return session is not None and session in (
        row.session_key,
        row.origin_session_id,
        row.origin_ui_session_id,
    )


def _listed(row: LedgerRow) -> JSONObject:
    try:
        spec = WatchSpec.from_request(row.request)
    except (WatchError, TypeError):
        return {"watch_id": row.id, "what": row.goal}
    return {
        "watch_id": row.id,
        "what": spec.describe(),
        "note": spec.note,
        "max_fires": spec.max_fires,
        "expires_in_seconds": round(max(0.0, spec.expires_at - time.time()), 1),
    }


def _running_watches(ctx: ToolContext, limit: int) -> list[LedgerRow]:
    from tools.delegation_runtime import get_runtime

    query = RowQuery(kind=WATCH_KIND, state=State.RUNNING.value, session=_session(ctx), limit=limit)
    return get_runtime().ledger.query(query)


def _create(
    manager: WatchManager, spec: WatchSpec, ctx: ToolContext
) -> JSONObject:  # blocking: run in a thread
    if (
        _session(ctx) is not None
        and len(_running_watches(ctx, MAX_WATCHES_PER_SESSION + 1)) >= MAX_WATCHES_PER_SESSION
    ):
        return {
            "error": f"this conversation already has {MAX_WATCHES_PER_SESSION} watches; "
            "cancel one (action=cancel) first"
        }
    watch_id = new_id("watch_")
    origin = WatchOrigin(ctx.session_key, ctx.session_id, ctx.origin_ui_session_id)
    try:
        manager.create(watch_id, spec, origin)
    except WatchError as exc:
        return {"error": str(exc)}
    return {
        "status": "watching",
        "watch_id": watch_id,
        "what": spec.describe(),
        "expires_in_seconds": round(spec.expires_at - spec.created_at, 1),
        "max_fires": spec.max_fires,
        "cooldown_seconds": spec.cooldown_seconds,
    }


def _cancel(args: JSONObject, ctx: ToolContext) -> JSONObject:  # blocking
    from tools.delegation_runtime import get_runtime

    watch_id = args.get("watch_id")
    if not isinstance(watch_id, str) or not watch_id:
        return {"error": "cancel needs watch_id (see action=list)"}
    runtime = get_runtime()
    row = runtime.ledger.get(watch_id)
    if row is None or row.kind != WATCH_KIND or not _mine(row, ctx):
        return {"error": f"no watch {watch_id[:64]} in this conversation"}
    outcome = runtime.cancel(watch_id, by="the agent")
    return {"watch_id": watch_id, "status": outcome.status}


def make_watch_tool(
    *,
    shell_enabled: bool,
    require_approval: bool = False,
    min_interval_seconds: float = MIN_INTERVAL_SECONDS,
    manager: Callable[[], WatchManager] | None = None,
    clock: Callable[[], float] = time.time,
) -> Tool:
    """`watch`, in the ``timers`` toolset. Command watches need ``shell_enabled`` and, with
    ``require_approval``, a person's yes (as the shell tool asks)."""

    def current() -> WatchManager:
        if manager is not None:
            return manager()
        from tools.watches import watch_manager  # resolved at call time, like the runtime

        return watch_manager

    async def handler(args: JSONObject, ctx: ToolContext) -> JSONObject:
        action = args.get("action") or "create"
        if action == "list":
            rows = await asyncio.to_thread(_running_watches, ctx, MAX_WATCHES_PER_SESSION)
            return {"watches": [_listed(row) for row in rows if _mine(row, ctx)]}
        if action == "cancel":
            return await asyncio.to_thread(_cancel, args, ctx)
        if action != "create":
            return {"error": "action must be create, list or cancel"}
        try:
            spec = parse_watch(args, clock(), min_interval_seconds=min_interval_seconds)
        except WatchError as exc:
            return {"error": str(exc)}
        if spec.kind == COMMAND:
            if not shell_enabled:
                return {"error": "a command watch runs a shell command: " + SHELL_DISABLED_ERROR}
            if ctx.confirm is None and require_approval:
                return {"error": NO_APPROVAL_ERROR, "denied": True}
            try:
                if ctx.confirm is not None and not await ctx.confirm(spec.command or ""):
                    return {"error": DENIED_ERROR, "denied": True}
            except ApprovalExpired:
                return {"error": EXPIRED_ERROR, "expired": True}
        await ctx.prepare_background()  # its origin session is written before any firing
        return await asyncio.to_thread(_create, current(), spec, ctx)

    return Tool(
        name="watch",
        description=DESCRIPTION,
        parameters=PARAMETERS,
        handler=handler,
        toolset=WAKEUP_TOOLSET,
    )
