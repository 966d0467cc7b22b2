"""`reveille backup DIR` and `reveille restore DIR`: a copy of every store of a state directory.

A backup is taken online, while servers run. Every SQLite file (the ledger, the session
store, the web UI's state, the Responses API's responses, Telegram's state) is copied as of
ONE point of the ledger's history (``storage.sqlite.snapshot``: a read snapshot of every
file is fixed while the ledger takes no write, then each is copied through it), so a
restored transcript never names a started unit the restored ledger lacks, and a result the
ledger calls delivered is in the transcript. The background processes' outputs are copied
as files. The copy is private: the directory 0700, every file 0600.

With PostgreSQL the ledger, the sessions and the rest are in the database, not in the state
directory: `reveille backup` refuses and says how to take one consistent dump (``pg_dump
--serializable-deferrable``); ``--local-only`` copies only what is local (process outputs,
Telegram's state), never stale SQLite files that a server no longer writes.

A restore goes into an empty (or new) state directory only. It checks that every store it
copied opens there, and that every started unit a transcript names has its ledger row
(``reveille.backup_check``); a backup that fails that check is refused, and nothing is
left behind, unless ``--repair``, which records each such unit as lost, so that its
conversation is told once. A restored ledger's pending deliveries are offered when a server
starts on it, each delivered once (the sinks are idempotent by delivery id).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import sys
from pathlib import Path
from typing import Any

from delivery.ledger import Ledger
from delivery.state_dir import ensure_private_dir
from gateway.surfaces.telegram.state import STATE_FILE as TELEGRAM_FILE
from reveille.backup_check import MissingUnit, missing_units, record_lost
from reveille.settings import load_settings
from storage.opener import (
    LEDGER_FILE,
    RESPONSES_FILE,
    SESSIONS_FILE,
    WEBUI_FILE,
    open_storage,
    snapshot_sqlite_files,
)
from tools.background_processes import PROCESSES_DIR

__all__ = ["STORE_FILES", "add_parsers", "backup", "pg_dump_advice", "restore"]

STORE_FILES = (LEDGER_FILE, SESSIONS_FILE, WEBUI_FILE, RESPONSES_FILE, TELEGRAM_FILE)
# With PostgreSQL only these stay in the state directory.
LOCAL_FILES = (TELEGRAM_FILE,)


class BackupError(Exception):
    """The backup or restore cannot be made (the message says why)."""


def add_parsers(subparsers: Any) -> None:
    b = subparsers.add_parser("backup", help="copy every store of the state directory to DIR")
    b.add_argument("dir", help="a new or empty directory")
    b.add_argument(
        "--local-only",
        action="store_true",
        help="with PostgreSQL: copy only the local files (the database needs pg_dump)",
    )
    b.set_defaults(func=_run_backup)
    r = subparsers.add_parser("restore", help="restore a backup into an empty state directory")
    r.add_argument("dir", help="a directory made by `reveille backup`")
    r.add_argument(
        "--repair",
        action="store_true",
        help="restore a backup whose transcripts name started work its ledger lacks, "
        "recording each such unit as lost (its conversation is told once)",
    )
    r.set_defaults(func=_run_restore)


def pg_dump_advice(target: str) -> str:
    """How to back up a PostgreSQL deployment in one consistent snapshot."""
    return (
        "the ledger, the sessions and every other store are in PostgreSQL: dump them in ONE "
        "snapshot (one transaction, so every table is at the same point of the ledger's "
        "history): `pg_dump --serializable-deferrable --format=custom "
        f'--file {os.path.join(target, "reveille.pgdump")} "$REVEILLE_DATABASE_URL"` '
        "(or the [storage] url; check the dump with `pg_restore --list`); then "
        "`reveille backup --local-only "
        f"{target}` copies what is local (process outputs, Telegram's state)"
    )


def _empty_private_dir(path: Path) -> None:
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise BackupError(f"{path} is not an empty directory; nothing was written")
    ensure_private_dir(path)


def _copy_tree(source: Path, target: Path) -> None:
    shutil.copytree(source, target, copy_function=shutil.copy2)
    for root, dirs, files in os.walk(target):
        os.chmod(root, 0o700)
        for name in files:
            os.chmod(os.path.join(root, name), 0o600)
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o700)


def backup(home: Path, target: Path, *, names: tuple[str, ...] = STORE_FILES) -> list[str]:
    """Copy the stores ``names`` of ``home`` into the new or empty ``target``, all as of one
    point of the ledger's history; what was copied."""
    if not home.is_dir():
        raise BackupError(f"state directory {home} does not exist")
    _empty_private_dir(target)
    files = [home / name for name in names if (home / name).is_file()]
    copied = snapshot_sqlite_files(files, home / LEDGER_FILE, target)
    if (home / PROCESSES_DIR).is_dir():
        _copy_tree(home / PROCESSES_DIR, target / PROCESSES_DIR)
        copied.append(PROCESSES_DIR + "/")
    return copied


def _describe(missing: list[MissingUnit]) -> str:
    shown = ", ".join(f"{m.handle} (session {m.session.id})" for m in missing[:5])
    more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
    return f"{shown}{more}"


def _check_started_units(home: Path, *, repair: bool) -> list[MissingUnit]:
    storage = open_storage(f"sqlite://{home.resolve()}")
    ledger = Ledger(storage.open_ledger())
    sessions = storage.open_sessions()
    try:
        missing = missing_units(ledger, sessions)
        if missing and not repair:
            raise BackupError(
                f"this backup is not consistent: {len(missing)} started unit(s) that its "
                f"transcripts name have no ledger row: {_describe(missing)}. It was "
                "probably taken while servers wrote, by a `reveille backup` older than the "
                "one that copies every store at one point. Nothing was restored; "
                "`reveille restore --repair` restores it and records each of them as lost, "
                "so that its conversation is told once"
            )
        record_lost(ledger, missing)
        return missing
    finally:
        sessions.close()
        ledger.close()


def restore(source: Path, home: Path, *, repair: bool = False) -> list[str]:
    """Copy a backup into the new or empty state directory ``home`` and check it there:
    every store opens, every started unit a transcript names has its ledger row (else
    ``BackupError`` and nothing is left in ``home``; with ``repair`` each is recorded as
    lost). What was restored, with a note per repaired unit."""
    names = [n for n in STORE_FILES if (source / n).is_file()]
    if not names:
        raise BackupError(f"{source} holds no Reveille store; nothing was written")
    fresh = not home.exists()
    _empty_private_dir(home)
    try:
        return _restore_into(source, home, names, repair=repair)
    except BaseException:
        # Leave the directory as it was found (new or empty): a rerun needs it empty.
        for entry in home.iterdir():
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        if fresh:
            home.rmdir()
        raise


def _restore_into(source: Path, home: Path, names: list[str], *, repair: bool) -> list[str]:
    snapshot_sqlite_files([source / n for n in names], None, home)
    if (source / PROCESSES_DIR).is_dir():
        _copy_tree(source / PROCESSES_DIR, home / PROCESSES_DIR)
    storage = open_storage(f"sqlite://{home.resolve()}")
    if LEDGER_FILE in names:
        storage.open_ledger().close()
    if SESSIONS_FILE in names:
        storage.open_sessions().close()
    if WEBUI_FILE in names:
        storage.open_webui().close()
    if RESPONSES_FILE in names:
        storage.open_responses().close()
    restored = list(names)
    if (source / PROCESSES_DIR).is_dir():
        restored.append(PROCESSES_DIR + "/")
    if SESSIONS_FILE in names:
        repaired = _check_started_units(home, repair=repair)
        restored += [f"{m.handle} recorded as lost" for m in repaired]
    return restored


def _run_backup(args: argparse.Namespace) -> int:
    settings = load_settings()
    names: tuple[str, ...] = STORE_FILES
    if settings.database_url:
        if not args.local_only:
            print(
                f"reveille backup: nothing was copied: {pg_dump_advice(args.dir)}", file=sys.stderr
            )
            return 2
        names = LOCAL_FILES
    try:
        copied = backup(settings.home, Path(args.dir).expanduser(), names=names)
    except (BackupError, OSError, sqlite3.Error) as exc:
        print(f"reveille backup: {exc}", file=sys.stderr)
        return 1
    print(f"copied {', '.join(copied) or 'nothing'} from {settings.home} to {args.dir}")
    if settings.database_url:
        print(f"the database was not copied: {pg_dump_advice(args.dir)}")
    return 0


def _run_restore(args: argparse.Namespace) -> int:
    settings = load_settings()
    if settings.database_url:
        print(
            "reveille restore: the stores are in PostgreSQL: restore the database with "
            '`pg_restore --clean --if-exists --dbname "$REVEILLE_DATABASE_URL" '
            "reveille.pgdump` while no server runs; nothing was restored",
            file=sys.stderr,
        )
        return 2
    try:
        restored = restore(Path(args.dir).expanduser(), settings.home, repair=args.repair)
    except Exception as exc:  # a copy that does not open is reported, in one line
        print(f"reveille restore: {exc}", file=sys.stderr)
        return 1
    print(
        f"restored {', '.join(restored)} into {settings.home}; every store opens and every "
        "started unit its transcripts name has its ledger row"
    )
    return 0
