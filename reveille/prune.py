"""`reveille prune [--dry-run]`: retention run by hand, with what it removed and how fast.

The same pruning a server runs every ``[retention] interval_seconds``
(``delivery.retention``), over the store the settings name, printed per kind: how many
were removed (or, with ``--dry-run``, would be), how long it took and the rate. Pending
rows, results not yet folded into their conversation, running work and live claims are
never removed. With SQLite it then gives the freed pages back to the file system, and
switches a file made before incremental vacuum existed with one ``VACUUM`` (this command is
that file's safe moment: it rewrites the file once; ``--no-vacuum`` skips it).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from delivery.errors import LedgerError
from delivery.retention import PruneReport, RetentionStores, run_retention
from delivery.session_backend import SessionStoreError
from reveille.operator_storage import operator_storage
from reveille.settings import load_settings
from storage.opener import StorageUrlError
from tools.background_processes import PROCESSES_DIR


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "prune",
        help="remove what retention allows now (settled rows, old records) and say how much",
        description=(
            "Prune by the [retention] settings: settled ledger rows, transcript rows "
            "compaction archived, idempotency records, tombstones, web UI events and process "
            "outputs older than their days, and stored API responses older than [responses] "
            "keep_days. Pending deliveries, unfolded results, running work, queued or running "
            "responses and live claims are never removed; a pruned row leaves a tombstone "
            "saying when and why."
        ),
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="only count what would be removed; remove nothing"
    )
    parser.add_argument(
        "--no-vacuum",
        action="store_true",
        help="SQLite: do not VACUUM files made before incremental vacuum (they keep their size)",
    )
    parser.set_defaults(func=run)


def format_report(report: PruneReport) -> str:
    lines = [k.describe(report.dry_run) for k in report.kinds]
    seconds = sum(k.seconds for k in report.kinds)
    rate = report.total / seconds if seconds > 0 else 0.0
    verb = "would remove" if report.dry_run else "removed"
    lines.append(f"total: {verb} {report.total} in {seconds:.2f} s ({rate:,.0f}/s)")
    for space in report.space:
        note = " (converted to incremental vacuum)" if space.converted else ""
        if space.needs_conversion:
            note = " (made before incremental vacuum: run without --no-vacuum to shrink it)"
        lines.append(f"{space.path}: {space.bytes_before} -> {space.bytes_after} bytes{note}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    settings = load_settings()
    try:
        location = operator_storage(settings)
        if not location.has("ledger"):
            print(f"nothing to prune: no ledger at {location.describe('ledger')} yet")
            return 0
        ledger = location.open_ledger()
    except (LedgerError, StorageUrlError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    sessions = webui = responses = hooks = None
    try:
        # Only the stores that exist: pruning never makes an empty file.
        if location.has("sessions"):
            sessions = location.open_sessions()
        if location.has("webui"):
            webui = location.open_webui()
        if location.has("responses"):
            responses = location.open_responses()
        hooks = location.open_hooks()  # in the ledger's file or database, there already
        stores = RetentionStores(
            ledger=ledger,
            sessions=sessions,
            webui=webui,
            processes_dir=settings.home / PROCESSES_DIR,
            reclaim=location.reclaim_space,
            responses=responses,
            hooks=hooks,
        )
        report = run_retention(
            stores, settings.retention_policy, dry_run=args.dry_run, convert=not args.no_vacuum
        )
    except (LedgerError, SessionStoreError, OSError) as exc:
        print(f"error: {exc}; what was pruned before it stays pruned", file=sys.stderr)
        return 1
    finally:
        for opened in (hooks, responses, webui, sessions, ledger):
            if opened is not None:
                opened.close()
    print(format_report(report))
    return 0
