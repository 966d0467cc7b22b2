"""`reveille deliveries`: the operator's view of the ledger — list, show, redeliver, drop.

``show`` also takes a webhook's delivery id (``evt_...``, the ``webhook-id`` its receivers
got): its row per endpoint and every attempt (``reveille.webhooks_cmd``)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from delivery.errors import LedgerError, NotALedgerError, UnknownDeliveryError
from delivery.ledger import Ledger
from delivery.rows import AuditEntry, LedgerRow, RowQuery
from delivery.states import DeliveryState, State
from reveille.operator_storage import operator_storage
from reveille.settings import Settings, load_settings
from reveille.webhooks_cmd import show_webhook

# Webhook delivery ids (gateway.webhooks.delivery_id_for); ledger rows are deleg_/proc_...
WEBHOOK_ID_PREFIX = "evt_"


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "deliveries",
        help="list, inspect, redeliver or drop ledger rows",
        description="The delivery ledger: one row per background task and its completion.",
    )
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

    ls = sub.add_parser("list", help="a table of rows, newest first")
    ls.add_argument("--state", choices=[s.value for s in State], help="lifecycle state")
    ls.add_argument(
        "--delivery-state", choices=[s.value for s in DeliveryState], help="delivery state"
    )
    ls.add_argument("--session", help="session key, API session id or web UI session id")
    ls.add_argument("--kind", choices=["delegation", "process"], help="kind of work")
    ls.add_argument(
        "--search",
        metavar="WORDS",
        help='rows whose goal holds every word, each as the start of a word ("back" finds'
        ' "nightly backup"); the whole ledger, through its text index',
    )
    ls.add_argument("--limit", type=int, default=50, help="at most this many rows (50)")
    ls.add_argument("--json", action="store_true", help="JSON lines instead of a table")

    show = sub.add_parser(
        "show", help="one row in full, with its event and history (or a webhook, evt_...)"
    )
    show.add_argument("id")
    show.add_argument("--json", action="store_true")

    again = sub.add_parser("redeliver", help="put a dropped row back to pending, fresh budget")
    again.add_argument("id")

    drop = sub.add_parser("drop", help="stop delivering a pending row (its result is kept)")
    drop.add_argument("id")
    drop.add_argument("--reason", default="dropped by an operator")

    sub.add_parser("servers", help="the running servers that share this ledger")

    parser.set_defaults(func=run)


def _age(ts: float | None, now: float) -> str:
    if not ts:
        return "-"
    secs = max(now - ts, 0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size:
            return f"{secs / size:.0f}{unit}"
    return f"{secs:.0f}s"


def _iso(ts: float | None) -> str:
    if not ts:
        return "-"
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def clip(text: str | None, width: int) -> str:
    """``text`` on one line, cut to ``width`` characters."""
    text = (text or "").replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


def text_table(headers: Sequence[str], table: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell, headers first (the operator's tables)."""
    widths = [max(len(h), *(len(r[i]) for r in table)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for r in table:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return "\n".join(lines)


def _session_of(row: LedgerRow) -> str:
    return row.origin_ui_session_id or row.origin_session_id or row.session_key or "-"


def format_table(rows: list[LedgerRow], now: float) -> str:
    headers = ("ID", "KIND", "STATE", "DELIVERY", "TRIES", "AGE", "SESSION", "GOAL")
    table = [
        (
            row.id,
            row.kind,
            row.state,
            row.delivery_state if row.completed_at else "-",
            str(row.delivery_attempts),
            _age(row.created_at, now),
            clip(_session_of(row), 28),
            clip(row.goal, 48),
        )
        for row in rows
    ]
    return text_table(headers, table)


def format_row(row: LedgerRow, history: list[AuditEntry]) -> str:
    fields = [
        ("id", row.id),
        ("kind", row.kind),
        ("goal", row.goal),
        ("state", row.state),
        ("delivery", row.delivery_state),
        ("attempts", f"{row.delivery_attempts} counted, {row.refunds} refunded"),
        ("session key", row.session_key),
        ("API session", row.origin_session_id),
        ("web UI session", row.origin_ui_session_id),
        ("created", _iso(row.created_at)),
        ("started", _iso(row.started_at)),
        ("completed", _iso(row.completed_at)),
        ("settled", f"{_iso(row.settled_at)}  {row.settled_reason or ''}".rstrip()),
        ("claimed by", row.claim_consumer or "-"),
        ("next attempt", _iso(row.next_attempt_at)),
        ("re-offered", f"{row.restored} time(s)"),
    ]
    width = max(len(k) for k, _ in fields)
    out = [f"{k.ljust(width)}  {v if v not in (None, '') else '-'}" for k, v in fields]
    if row.event is not None:
        out += ["", "event:", json.dumps(row.event, indent=2, ensure_ascii=False)]
    if history:
        out += ["", "history:"]
        out += [f"  {_iso(h['at'])}  {h['action']}: {h['detail']}" for h in history]
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    settings = load_settings()
    if args.action == "show" and args.id.startswith(WEBHOOK_ID_PREFIX):
        return show_webhook(settings, args.id, as_json=args.json)
    return with_ledger(
        settings, "deliveries", lambda ledger: _act(ledger, args), absent=args.action != "list"
    )


def with_ledger(
    settings: Settings, command: str, act: Callable[[Ledger], int], *, absent: bool = False
) -> int:
    """Run ``act`` on the ledger of ``settings``, opened through the opener as an operator's
    tool (a database's schema is checked, never migrated), saying what went wrong in words
    when it cannot. No ledger yet: said, and nothing is created (a look must not create
    it); the exit status is ``absent`` (0 for a list, 1 for an action on a row)."""
    try:
        location = operator_storage(settings)
    except (LedgerError, ValueError) as exc:
        print(f"reveille {command}: {exc}", file=sys.stderr)
        return 1
    if not location.has("ledger"):
        print(f"no ledger at {location.describe('ledger')} yet (REVEILLE_HOME={settings.home})")
        return int(absent)
    where = location.describe("ledger")
    try:
        ledger = Ledger(location.open_ledger(operator=True), settings.delivery_policy)
    except (LedgerError, OSError) as exc:
        print(explain(exc, where), file=sys.stderr)
        return 1
    try:
        return act(ledger)
    except (LedgerError, OSError) as exc:
        print(explain(exc, where), file=sys.stderr)
        return 1
    finally:
        ledger.close()


def explain(exc: BaseException, path: Path | str) -> str:
    """One or two lines for an expected fault: what happened, that nothing was written,
    what to do. A healthy ledger that is only locked or read-only is never called broken."""
    text = str(exc)
    if isinstance(exc, NotALedgerError):
        return (
            f"error: {path} is not a Reveille ledger; nothing was read or written.\n"
            "Move it aside, or point REVEILLE_HOME at the state directory you meant."
        )
    if "locked" in text or "busy" in text:
        return (
            f"error: the ledger {path} is locked by another process; nothing was written.\n"
            "Try again in a moment (a long transaction elsewhere holds it)."
        )
    if "readonly" in text or "read-only" in text or isinstance(exc, PermissionError):
        return (
            f"error: the ledger {path} cannot be written here (read-only); nothing was written.\n"
            "Run as the user that owns it, or check the directory's permissions."
        )
    if isinstance(exc, UnknownDeliveryError):
        return f"error: {text}"
    return f"error: {text}\nNothing was written."


def _act(ledger: Ledger, args: argparse.Namespace) -> int:
    if args.action == "list":
        rows = ledger.query(
            RowQuery(
                state=args.state,
                delivery_state=args.delivery_state,
                session=args.session,
                kind=args.kind,
                limit=args.limit,
                text=args.search,
            )
        )
        if args.json:
            for row in rows:
                print(json.dumps(row.as_dict(), default=str))
        elif rows:
            print(format_table(rows, time.time()))
        else:
            print("no rows match")
        return 0
    if args.action == "servers":
        servers = ledger.servers.peers()  # this command is not a server: all of them
        if not servers:
            print("no server is running on this state directory")
        for record in servers:
            print(record.describe())
        return 0
    found = ledger.get(args.id)
    if found is None:
        tomb = ledger.pruned(args.id)
        if tomb is not None:
            # A late question about a pruned row gets when and why, not "no such row".
            if args.action == "show" and args.json:
                print(json.dumps({**asdict(tomb), "pruned": tomb.describe()}, indent=2))
            elif args.action == "show":
                print(f"{args.id}: {tomb.describe()}")
            else:
                print(f"error: {args.id} was {tomb.describe()}", file=sys.stderr)
            return 0 if args.action == "show" else 1
        print(f"error: no ledger row {args.id!r}", file=sys.stderr)
        return 1
    row = found
    if args.action == "show":
        if args.json:
            print(
                json.dumps(
                    {**row.as_dict(), "history": ledger.history(args.id)}, default=str, indent=2
                )
            )
        else:
            print(format_row(row, ledger.history(args.id)))
        return 0
    if args.action == "redeliver":
        ledger.redeliver(args.id)
        reached = ledger.notify_others()  # through the store's own notifier
        note = "a running server picks it up now" if reached else "it is offered at next start"
        print(f"{args.id}: pending again with a fresh budget; {note}")
        return 0
    if args.action == "drop":
        if ledger.drop(args.id, args.reason):
            print(f"{args.id}: dropped ({args.reason}); its result stays queryable")
            return 0
        print(f"error: {args.id} is {row.delivery_state}, not pending", file=sys.stderr)
        return 1
    raise AssertionError(args.action)
