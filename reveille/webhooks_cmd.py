"""`reveille webhooks`: the signing secret (create, show, rotate) and the outgoing webhooks.

The secret made here is stored in the store (``ledger.db``, or the PostgreSQL database), so
every server sharing it signs with it, and a rotation reaches all of them at once; the
rotated-out secret keeps signing beside the new one for 24 h. A secret set in the settings
(``[webhooks] secret``) takes precedence and is never stored: rotate that one by hand.
``reveille deliveries show <evt_...>`` shows one webhook's rows and attempts (``show_webhook``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from typing import Any

from delivery.errors import LedgerError
from delivery.webhooks_backend import WebhookAttempt, WebhookBackend, WebhookDelivery
from gateway.webhooks import ROTATION_OVERLAP_SECONDS, new_secret
from reveille.operator_storage import storage_to_look_at
from reveille.settings import Settings, load_settings

__all__ = ["add_parser", "format_webhook", "open_webhook_store", "show_webhook"]


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "webhooks",
        help="the webhook signing secret and the outgoing webhooks",
        description="Standard-Webhooks-signed events sent to [webhooks] urls.",
    )
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    secret = sub.add_parser(
        "secret", help="print the signing secret, creating one if there is none"
    )
    secret.add_argument(
        "--rotate",
        action="store_true",
        help="make a new secret; the old one keeps signing beside it for 24 h",
    )
    ls = sub.add_parser("list", help="the newest webhook deliveries, one line per endpoint")
    ls.add_argument("--state", choices=["pending", "delivered", "dropped"])
    ls.add_argument("--limit", type=int, default=50, help="at most this many rows (50)")
    parser.set_defaults(func=run)


def open_webhook_store(settings: Settings, *, look: bool = False) -> WebhookBackend | None:
    """The webhook tables where the server keeps them (``storage_to_look_at``); with ``look``,
    None when there is no ledger yet."""
    location = storage_to_look_at(settings, look=look)
    return None if location is None else location.open_webhooks()


def run(args: argparse.Namespace) -> int:
    settings = load_settings()
    if args.action == "secret" and settings.webhook_secret:
        print(
            "reveille webhooks: the secret set in the settings (REVEILLE_WEBHOOK_SECRET / "
            "[webhooks] secret) signs; change it there, or remove it to use a stored one",
            file=sys.stderr,
        )
        return 1
    try:
        backend = open_webhook_store(settings, look=args.action == "list")
    except (LedgerError, OSError, ValueError) as exc:
        print(f"reveille webhooks: {exc}", file=sys.stderr)
        return 1
    if backend is None:
        print("no webhook deliveries")  # and no store created just to look
        return 0
    try:
        if args.action == "secret":
            return _secret(backend, rotate=args.rotate)
        rows = backend.recent(args.limit, args.state)
        print(format_table(rows, time.time()) if rows else "no webhook deliveries")
        return 0
    except LedgerError as exc:
        print(f"reveille webhooks: {exc}", file=sys.stderr)
        return 1
    finally:
        backend.close()


def _secret(backend: WebhookBackend, *, rotate: bool) -> int:
    now = time.time()
    current = backend.secrets(now)
    if current and not rotate:
        print(current[0].secret)
        return 0
    secret = new_secret()
    backend.rotate_secret(secret, now, ROTATION_OVERLAP_SECONDS)
    if current:
        print(
            f"rotated: the old secret keeps signing until {_iso(now + ROTATION_OVERLAP_SECONDS)}",
            file=sys.stderr,
        )
    print(secret)
    return 0


def _iso(ts: float | None) -> str:
    if not ts:
        return "-"
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def format_table(rows: list[WebhookDelivery], now: float) -> str:
    headers = ("ID", "TYPE", "STATE", "TRIES", "CREATED", "ENDPOINT")
    table = [
        (r.id, r.event_type, r.state, str(r.attempts), _iso(r.created_at), r.endpoint) for r in rows
    ]
    widths = [max(len(h), *(len(r[i]) for r in table)) for i, h in enumerate(headers)]
    lines = [headers, *table]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )


def format_webhook(rows: list[WebhookDelivery], attempts: list[WebhookAttempt]) -> str:
    first = rows[0]
    out = [
        f"id        {first.id}",
        f"type      {first.event_type}",
        f"object    {first.object_id}",
        f"created   {_iso(first.created_at)}",
        f"payload   {first.body}",
    ]
    for row in rows:
        out += [
            "",
            f"endpoint  {row.endpoint}",
            f"  state         {row.state}  {row.settled_reason or ''}".rstrip(),
            f"  attempts      {row.attempts}",
            f"  next attempt  {_iso(row.next_attempt_at) if row.state == 'pending' else '-'}",
        ]
        mine = [a for a in attempts if a.endpoint == row.endpoint]
        for a in mine:
            answer = f"HTTP {a.status}" if a.status is not None else (a.error or "no answer")
            out.append(f"    {_iso(a.at)}  {a.outcome:<9}  {answer}  (by {a.consumer})")
    return "\n".join(out)


def show_webhook(settings: Settings, delivery_id: str, *, as_json: bool) -> int:
    """``reveille deliveries show <evt_...>``: one webhook's rows and every attempt."""
    import dataclasses
    import json

    try:
        backend = open_webhook_store(settings, look=True)
    except (LedgerError, OSError, ValueError) as exc:
        print(f"reveille deliveries: {exc}", file=sys.stderr)
        return 1
    if backend is None:
        print(f"no ledger at {settings.home} yet (REVEILLE_HOME={settings.home})")
        return 1
    try:
        rows = backend.deliveries(delivery_id)
        attempts = backend.attempts(delivery_id)
    except LedgerError as exc:
        print(f"reveille deliveries: {exc}", file=sys.stderr)
        return 1
    finally:
        backend.close()
    if not rows:
        print(f"error: no webhook {delivery_id!r}", file=sys.stderr)
        return 1
    if as_json:
        document = {
            "deliveries": [dataclasses.asdict(r) for r in rows],
            "attempts": [dataclasses.asdict(a) for a in attempts],
        }
        print(json.dumps(document, indent=2))
    else:
        print(format_webhook(rows, attempts))
    return 0
