"""`reveille background`: the queued and running background units, and stopping one.

``list`` shows each unit's state, elapsed time, its step (a model call, a tool, a command)
and its last output line, as written to the store by whichever server runs it (``--watch``
redraws it every second). ``cancel ID`` settles the unit ``cancelled`` in the ledger; the
server that runs it notices at once (a poke through the store's notifier) and stops it: a
sub-agent's model call is aborted, a command's whole process group killed. The
conversation gets one notice saying it was stopped from the command line.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
import time
from datetime import UTC, datetime
from typing import Any

from delivery.cancel import ALREADY_FINISHED, CANCELLED, BackgroundUnit, active_units
from delivery.ledger import Ledger
from reveille.deliveries import clip, text_table, with_ledger
from reveille.settings import load_settings

WATCH_INTERVAL_SECONDS = 1.0


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "background",
        help="list the running background work, or stop one unit",
        description="Background units (sub-agents, shell commands) still queued or running.",
    )
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    ls = sub.add_parser("list", help="queued and running units with their progress")
    ls.add_argument("--session", help="session key, API session id or web UI session id")
    ls.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    ls.add_argument("--watch", action="store_true", help="redraw every second until Ctrl-C")
    cancel = sub.add_parser("cancel", help="stop a unit; its conversation is told once")
    cancel.add_argument("id")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = load_settings()
    absent = args.action != "list"  # no ledger yet: a list is empty, an action fails
    if args.action == "cancel":
        return with_ledger(
            settings, "background", lambda ledger: cancel(ledger, args.id), absent=absent
        )
    return with_ledger(settings, "background", lambda ledger: show(ledger, args), absent=absent)


def who() -> str:
    """How a notice names a cancel made here."""
    try:
        return f"{getpass.getuser()} on the command line"
    except (KeyError, OSError):
        return "the command line"


def cancel(ledger: Ledger, row_id: str) -> int:
    outcome = ledger.cancel(row_id, by=who(), deliver_here=False)
    if outcome.status == CANCELLED:
        # The owner stops the work, and a server offers the notice, once poked.
        reached = ledger.notify_others()
        note = "its server stops it now" if reached else "no server is running to stop it"
        print(f"{row_id}: cancelled; {note}")
        return 0
    if outcome.status == ALREADY_FINISHED:
        print(f"{row_id}: already finished ({outcome.state or 'ended meanwhile'}); nothing to stop")
        return 0
    print(f"error: no background unit {row_id!r}", file=sys.stderr)
    return 1


def show(ledger: Ledger, args: argparse.Namespace) -> int:
    while True:
        units = active_units(ledger.views, time.time(), session=args.session)
        if args.json:
            for unit in units:
                print(json.dumps(unit.as_dict(), default=str))
        else:
            if args.watch:
                print("\x1b[H\x1b[2J", end="")  # redraw in place
            print(format_table(units) if units else "nothing is running in the background")
        if not args.watch:
            return 0
        sys.stdout.flush()
        time.sleep(WATCH_INTERVAL_SECONDS)


def _elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _due(when: float | None) -> str:
    if when is None:
        return ""
    return datetime.fromtimestamp(when, tz=UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def format_table(units: list[BackgroundUnit]) -> str:
    headers = ("ID", "KIND", "STATE", "ELAPSED", "STEP", "LAST LINE", "GOAL", "DUE")
    table = [
        (
            u.id,
            u.kind,
            u.state,
            _elapsed(u.elapsed_seconds),
            clip(u.step, 28),
            clip(u.line, 40),
            clip(u.goal, 40),
            _due(u.due_at),
        )
        for u in units
    ]
    return text_table(headers, table)
