"""`reveille approvals`: the operator's view of pending shell-command approvals — list,
approve, deny — on the state directory (or PostgreSQL) a running server uses.

A decision is written to the store once (``gateway.approvals.decide_approval``); the
server whose turn (or background unit) waits for it reads it within two seconds and goes
on, whichever surface asked (web UI, API server, Telegram). An approval whose turn is gone
(its server died or restarted) is settled as denied and reported as expired; a background
unit's past its deadline, or whose unit's process is gone, is settled expired (with the
conversation's one notice) when listed or decided.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from typing import Any

from delivery.errors import LedgerError
from gateway.approvals import (
    AlreadyDecided,
    Expired,
    FormError,
    decide_approval,
    pending_approvals,
)
from gateway.delivery_targets import session_platform
from gateway.session import SessionStore, SessionStoreError
from reveille.operator_storage import operator_storage
from reveille.settings import load_settings

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "approvals",
        help="list, approve or deny the shell commands waiting for a person",
        description="Shell commands the agent wants to run and waits to have approved.",
    )
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    ls = sub.add_parser("list", help="the pending approvals, oldest first")
    ls.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    for action, text in (("approve", "run the command, once"), ("deny", "do not run it")):
        one = sub.add_parser(action, help=text)
        one.add_argument("id", help="the approval id (appr_...)")
        if action == "approve":
            one.add_argument(
                "--values",
                metavar="JSON",
                help="a form's answer (an MCP server's question), a JSON object of its "
                "fields; without it a form gets its defaults",
            )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = load_settings()
    try:
        # An operator's tool never migrates: a schema it does not know is refused.
        location = operator_storage(settings)
        if not location.has("sessions"):
            where = location.describe("sessions")
            print(f"no session store at {where} yet (REVEILLE_HOME={settings.home})")
            return 0 if args.action == "list" else 1
        store = SessionStore(location.open_sessions())
    except (SessionStoreError, LedgerError, OSError, ValueError) as exc:
        print(f"reveille approvals: {exc}", file=sys.stderr)
        return 1
    try:
        if args.action == "list":
            return _list(store, as_json=args.json)
        values = getattr(args, "values", None)
        return _decide(store, args.id, args.action == "approve", values)
    except (SessionStoreError, OSError) as exc:
        print(f"reveille approvals: {exc}; nothing was written", file=sys.stderr)
        return 1
    finally:
        store.close()


def _list(store: SessionStore, *, as_json: bool) -> int:
    rows = []
    for record in pending_approvals(store):
        session = store.get_session(record.session_id)
        surface = session_platform(session).value if session is not None else "-"
        rows.append((record, surface))
    if as_json:
        for record, surface in rows:
            print(
                json.dumps(
                    {
                        "id": record.id,
                        "session_id": record.session_id,
                        "surface": surface,
                        "command": record.command,
                        "created_at": record.created_at,
                        "unit_id": record.unit_id or None,
                        "expires_at": record.expires_at if record.background else None,
                        "form": json.loads(record.form) if record.form else None,
                    }
                )
            )
        return 0
    if not rows:
        print("no approvals are pending")
        return 0
    now = time.time()
    for record, surface in rows:
        asked = dt.datetime.fromtimestamp(record.created_at, dt.UTC).strftime("%H:%M:%S UTC")
        waited = max(now - record.created_at, 0)
        # The command is shown as a repr: a newline or an escape sequence in it cannot
        # forge another line of this listing or drive the operator's terminal.
        print(f"{record.id}  {surface}  {record.session_id}  asked {asked} ({waited:.0f}s ago)")
        if record.background:
            left = max(record.expires_at - now, 0)
            print(f"    background task {record.unit_id}, expires in {left:.0f}s")
        print(f"    {record.command!r}")
    return 0


def _decide(
    store: SessionStore, approval_id: str, approve: bool, values_text: str | None = None
) -> int:
    values = None
    if values_text is not None:
        try:
            values = json.loads(values_text)
        except ValueError as exc:
            print(f"error: --values is not JSON: {exc}", file=sys.stderr)
            return 2
        if not isinstance(values, dict):
            print("error: --values must be a JSON object of the form's fields", file=sys.stderr)
            return 2
    try:
        record = decide_approval(store, approval_id, approve, by="the CLI", values=values)
    except FormError as exc:
        print(f"error: {approval_id}: {exc}; nothing was decided", file=sys.stderr)
        return 1
    except KeyError:
        print(f"error: no approval {approval_id!r}", file=sys.stderr)
        return 1
    except Expired as exc:
        why = (
            "nobody answered before its deadline, or the background task that asked it is "
            "gone; it was settled as expired and nothing ran"
            if exc.record.background
            else "the turn that asked it is gone (its server stopped or restarted); it was "
            "settled as denied and nothing ran"
        )
        print(f"error: {approval_id} expired: {why}", file=sys.stderr)
        return 1
    except AlreadyDecided:
        found = store.get_approval(approval_id)
        status = found.status if found is not None else "decided"
        if status == "expired":
            print(
                f"error: {approval_id} expired: nobody answered in time (or its background "
                "task stopped); nothing ran",
                file=sys.stderr,
            )
        else:
            print(f"error: {approval_id} was already decided ({status})", file=sys.stderr)
        return 1
    if record.form:
        verb = (
            f"approved with {record.answer}: the server gets this answer"
            if record.status == "approved"
            else "declined: the server is told no"
        )
    else:
        verb = "approved: the command runs once" if approve else "denied: the command does not run"
    waiter = f"background task {record.unit_id}" if record.background else "turn"
    print(f"{record.id} {verb} ({record.command!r}); the waiting {waiter} goes on within seconds")
    return 0
