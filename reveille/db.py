"""`reveille db`: the PostgreSQL schema for operators — its version, and migrating it.

``reveille db status`` prints the schema version the database is at, the newest this build
knows and what would be applied; ``reveille db migrate`` applies it (under the same
advisory lock the servers take at start, so it is safe while servers start). Both read
``REVEILLE_DATABASE_URL`` / ``[storage] url``; with SQLite there is nothing to migrate by hand.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from reveille.settings import load_settings


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("db", help="the PostgreSQL schema: status, migrate")
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    sub.add_parser("status", help="schema version of the database and pending migrations")
    sub.add_parser("migrate", help="apply pending migrations")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from delivery.errors import LedgerError
    from reveille.app import storage_url
    from storage import open_storage

    settings = load_settings()
    try:
        # Neither migrated nor checked on open: reporting where the schema stands (or
        # migrating it) is this command's whole job.
        location = open_storage(storage_url(settings), migrate=False, check=False)
        report = location.schema(apply=args.action == "migrate")
    except (LedgerError, ValueError) as exc:
        print(f"reveille db: {exc}", file=sys.stderr)
        return 1
    if report is None:
        print(
            "reveille db: no PostgreSQL store configured (REVEILLE_DATABASE_URL or "
            "[storage] url); the SQLite files under REVEILLE_HOME migrate themselves on open"
        )
        return 1
    if args.action == "migrate":
        if report.applied:
            print(
                f"applied migration(s) {', '.join(map(str, report.applied))} "
                f"to {report.redacted_url}"
            )
        else:
            print(f"{report.redacted_url} is up to date")
    print(f"database: {report.redacted_url}")
    print(f"schema version: {report.current} (this Reveille knows up to {report.latest})")
    if report.too_new:
        print("the schema is NEWER than this Reveille: upgrade Reveille before serving")
        return 1
    for version, description in report.pending:
        print(f"pending: {version} {description}  (run `reveille db migrate`)")
    return 0
