"""`reveille hooks`: the inbound-event hooks (``POST /v1/hooks/{name}``).

``reveille hooks secret NAME`` creates the hook's verification secret, or rotates it when
it has one, and prints the new one: this is the only time it is shown (give it to the
sender). A rotated-out secret keeps verifying for ``[hooks] rotation_overlap_seconds``
(24 h), so the sender can switch without a refused event. Secrets live in the store
(``ledger.db``, created private, or the PostgreSQL database), so every server sharing it
verifies with them at once. ``reveille hooks list`` shows each hook, where its events go,
its secret's state and its last event.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from typing import Any

from delivery.errors import LedgerError
from delivery.inbound_backend import HookBackend
from gateway.webhooks import new_secret
from reveille.hook_settings import HOOK_NAME
from reveille.operator_storage import storage_to_look_at
from reveille.settings import Settings, load_settings
from storage.opener import StorageUrlError

__all__ = ["add_parser", "format_hooks", "open_hook_store"]


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "hooks",
        help="inbound-event hooks: their secrets and last events",
        description="Hooks receive Standard-Webhooks-signed events at POST /v1/hooks/NAME.",
    )
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    secret = sub.add_parser(
        "secret",
        help="create the hook's secret, or rotate it (the old one verifies 24 h longer); "
        "prints the new one, once",
    )
    secret.add_argument("name", help="the hook's name ([hooks.NAME] in the settings)")
    sub.add_parser("list", help="each hook, its route, its secret and its last event")
    parser.set_defaults(func=run)


def open_hook_store(settings: Settings, *, look: bool = False) -> HookBackend | None:
    """The hook tables where the server keeps them (``storage_to_look_at``); with ``look``,
    None when there is no ledger yet."""
    location = storage_to_look_at(settings, look=look)
    return None if location is None else location.open_hooks()


def run(args: argparse.Namespace) -> int:
    settings = load_settings()
    if args.action == "secret" and not HOOK_NAME.fullmatch(args.name):
        print(
            "reveille hooks: a hook name is 1-64 letters, digits, '_', '-' or '.'",
            file=sys.stderr,
        )
        return 2
    try:
        backend = open_hook_store(settings, look=args.action == "list")
    except (LedgerError, OSError, StorageUrlError) as exc:
        print(f"reveille hooks: {exc}", file=sys.stderr)
        return 1
    if backend is None:  # nothing stored yet, and no store created just to look
        print(format_hooks(None, settings, time.time()))
        return 0
    try:
        if args.action == "secret":
            return _secret(backend, settings, args.name)
        print(format_hooks(backend, settings, time.time()))
        return 0
    except LedgerError as exc:
        print(f"reveille hooks: {exc}", file=sys.stderr)
        return 1
    finally:
        backend.close()


def _secret(backend: HookBackend, settings: Settings, name: str) -> int:
    now = time.time()
    overlap = settings.hooks_rotation_overlap_seconds
    had = backend.secrets(name, now)
    secret = new_secret()
    backend.rotate_secret(name, secret, now, overlap)
    if name not in {r.name for r in settings.hooks}:
        print(
            f"note: no [hooks.{name}] in the settings yet: the server answers 404 until "
            "it is declared",
            file=sys.stderr,
        )
    if had:
        print(
            f"rotated: the old secret still verifies until {_iso(now + overlap)}",
            file=sys.stderr,
        )
    print(secret)
    return 0


def _iso(ts: float | None) -> str:
    if not ts:
        return "-"
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def format_hooks(backend: HookBackend | None, settings: Settings, now: float) -> str:
    """The table of ``reveille hooks list``; ``backend`` None: no store yet (nothing stored)."""
    declared = {r.name: r for r in settings.hooks}
    stored = backend.hooks_with_secrets(now) if backend is not None else []
    names = sorted(set(declared) | set(stored))
    if not names:
        return "no hooks: declare one with [hooks.NAME] and run `reveille hooks secret NAME`"
    last = {e.hook: e for e in backend.last_events()} if backend is not None else {}
    headers = ("HOOK", "ROUTE", "SECRET", "LAST EVENT")
    table = []
    for name in names:
        route = declared.get(name)
        if route is None:
            where = "(not declared: 404)"
        elif route.session:
            where = f"session {route.session}"
        else:
            where = "wake_when waits"
        secrets = backend.secrets(name, now) if backend is not None else []
        if not secrets:
            secret = "none"
        elif len(secrets) > 1:
            rotating = min(s.expires_at or now for s in secrets[1:])
            secret = f"set (old one until {_iso(rotating)})"
        else:
            secret = "set"
        event = last.get(name)
        seen = f"{event.webhook_id} at {_iso(event.received_at)}" if event else "-"
        table.append((name, where, secret, seen))
    widths = [max(len(h), *(len(r[i]) for r in table)) for i, h in enumerate(headers)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
        for line in [headers, *table]
    )
