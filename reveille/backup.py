"""`reveille backup DIR` and `reveille restore DIR`: a copy of every store, and putting it back.

The storage is opened through the opener (``storage.open_storage``) and its dialect makes
the copy, every store as of ONE point of the ledger's history, so a restored transcript
never names a started unit the restored ledger lacks, and a result the ledger calls
delivered is in the transcript:

- SQLite: every file of the state directory (the ledger, the session store, the web UI's
  state, the Responses API's responses, the chat platforms' state) is copied online, while
  servers run (``storage.sqlite.snapshot``: a read snapshot of every file is fixed while
  the ledger takes no write, then each is copied through it).
- PostgreSQL: ``pg_dump`` of the store's schema in one serializable transaction, in the
  custom format (``reveille.pgdump``), checked with ``pg_restore --list``
  (``storage.postgres.backup``). Without ``pg_dump`` the command says so, with the manual
  procedure, and copies nothing; ``--local-only`` copies only what is local.

The background processes' outputs (and an old ``telegram.db`` not yet absorbed) are copied
as files. The copy is private: the directory 0700, every file 0600.

A restore goes into an empty (or new) state directory only, and with PostgreSQL into a
schema that holds no Reveille store (``pg_restore --single-transaction``). It checks that
every store opens there, and that every started unit a transcript names has its ledger row
(``reveille.backup_check``); a SQLite backup that fails that check is refused, and nothing
is left behind, unless ``--repair``, which records each such unit as lost, so that its
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
from typing import Any, Protocol

from delivery.errors import LedgerError
from delivery.ledger import Ledger
from delivery.state_dir import ensure_private_dir
from reveille.app import storage_url
from reveille.backup_check import MissingUnit, missing_units, record_lost
from reveille.settings import load_settings
from storage.opener import (
    LEGACY_TELEGRAM_FILE,
    BackupToolMissing,
    BackupUnavailable,
    Storage,
    StoreName,
    open_storage,
    snapshot_sqlite_files,
)
from tools.background_processes import PROCESSES_DIR

__all__ = ["BackupError", "add_parsers", "backup", "restore"]

# A backup or restore that cannot be made (the message says why); the dialects raise it.
BackupError = BackupUnavailable

# What a restore opens to check that it is usable, by the dialect's store names.
_STORES: tuple[StoreName, ...] = ("ledger", "sessions", "webui", "responses", "chats")


def add_parsers(subparsers: Any) -> None:
    b = subparsers.add_parser("backup", help="copy every store (files or database) to DIR")
    b.add_argument("dir", help="a new or empty directory")
    b.add_argument(
        "--local-only",
        action="store_true",
        help="copy only the local files (process outputs), not the stores",
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


def _empty_private_dir(path: Path) -> None:
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise BackupError(f"{path} is not an empty directory; nothing was written")
    ensure_private_dir(path)


def _clear(path: Path, *, fresh: bool) -> None:
    """Leave ``path`` as it was found (new or empty): a rerun needs it empty."""
    if not path.is_dir():
        return
    for entry in path.iterdir():
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    if fresh:
        path.rmdir()


def _copy_tree(source: Path, target: Path) -> None:
    shutil.copytree(source, target, copy_function=shutil.copy2)
    for root, dirs, files in os.walk(target):
        os.chmod(root, 0o700)
        for name in files:
            os.chmod(os.path.join(root, name), 0o600)
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o700)


def _copy_local(source: Path, target: Path, *, done: list[str]) -> list[str]:
    """The local files no store holds: an old Telegram file (unless the stores' copy took
    it) and the background processes' outputs; what was copied."""
    copied: list[str] = []
    legacy = source / LEGACY_TELEGRAM_FILE
    if LEGACY_TELEGRAM_FILE not in done and legacy.is_file():
        copied += snapshot_sqlite_files([legacy], None, target)
    if (source / PROCESSES_DIR).is_dir():
        _copy_tree(source / PROCESSES_DIR, target / PROCESSES_DIR)
        copied.append(PROCESSES_DIR + "/")
    return copied


def _sqlite_url(home: Path) -> str:
    return f"sqlite://{home.expanduser().resolve().as_posix()}"


def backup(
    home: Path, target: Path, *, url: str | None = None, local_only: bool = False
) -> list[str]:
    """Copy the stores at ``url`` (by default the SQLite state directory ``home``), all as of
    one point of the ledger's history, and the local files of ``home`` into the new or empty
    ``target``; what was copied. ``local_only``: the local files alone."""
    # Opened first: a store that cannot be reached leaves no directory behind.
    location = None if local_only else open_storage(url or _sqlite_url(home), migrate=False)
    fresh = not target.exists()
    _empty_private_dir(target)
    try:
        copied = location.backup(target) if location is not None else []
        return copied + _copy_local(home, target, done=copied)
    except BaseException:
        _clear(target, fresh=fresh)
        raise


def _describe(missing: list[MissingUnit]) -> str:
    shown = ", ".join(f"{m.handle} (session {m.session.id})" for m in missing[:5])
    more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
    return f"{shown}{more}"


def _check_started_units(location: Storage, *, repair: bool) -> list[MissingUnit]:
    ledger = Ledger(location.open_ledger(operator=True))
    try:
        sessions = location.open_sessions()
    except BaseException:
        ledger.close()
        raise
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


def restore(source: Path, home: Path, *, repair: bool = False, url: str | None = None) -> list[str]:
    """Put a backup back into the stores at ``url`` (by default the SQLite state directory
    ``home``, which must be new or empty, as must a database's schema) and its local files
    into ``home``, and check it there: every store opens, every started unit a transcript
    names has its ledger row (else ``BackupError``; with ``repair`` each is recorded as
    lost). What was restored, with a note per repaired unit. A refused SQLite restore
    leaves ``home`` as it was found."""
    url = url or _sqlite_url(home)
    target = open_storage(url, migrate=False, check=False)
    fresh = not home.exists()
    _empty_private_dir(home)
    try:
        restored = target.restore(source)
        restored += _copy_local(source, home, done=restored)
        # Opened as a server would open it: a schema it does not know is refused.
        location = open_storage(url, migrate=False)
        for store in _STORES:
            if location.has(store):
                _open_and_close(location, store)
        if location.has("sessions") and location.has("ledger"):
            repaired = _check_started_units(location, repair=repair)
            restored += [f"{m.handle} recorded as lost" for m in repaired]
        return restored
    except BaseException:
        _clear(home, fresh=fresh)
        raise


def _open_and_close(location: Storage, store: StoreName) -> None:
    opened: Closeable
    if store == "ledger":
        opened = location.open_ledger(operator=True)
    elif store == "sessions":
        opened = location.open_sessions()
    elif store == "webui":
        opened = location.open_webui()
    elif store == "responses":
        opened = location.open_responses()
    else:
        opened = location.open_telegram()
    opened.close()


class Closeable(Protocol):
    def close(self) -> None: ...


def _run_backup(args: argparse.Namespace) -> int:
    settings = load_settings()
    target = Path(args.dir).expanduser()
    try:
        copied = backup(
            settings.home, target, url=storage_url(settings), local_only=args.local_only
        )
    except BackupToolMissing as exc:  # the procedure is in the message: the operator's turn
        print(f"reveille backup: nothing was copied: {exc}", file=sys.stderr)
        return 2
    except (BackupError, LedgerError, ValueError, OSError, sqlite3.Error) as exc:
        print(f"reveille backup: nothing was copied: {exc}", file=sys.stderr)
        return 1
    print(f"copied {', '.join(copied) or 'nothing'} from {settings.home} to {args.dir}")
    if args.local_only:
        print("the stores were not copied (--local-only): run `reveille backup` without it")
    return 0


def _run_restore(args: argparse.Namespace) -> int:
    settings = load_settings()
    try:
        restored = restore(
            Path(args.dir).expanduser(),
            settings.home,
            repair=args.repair,
            url=storage_url(settings),
        )
    except BackupToolMissing as exc:
        print(f"reveille restore: nothing was restored: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a copy that does not open is reported, in one line
        print(f"reveille restore: {exc}", file=sys.stderr)
        return 1
    print(
        f"restored {', '.join(restored)} into {settings.home}; every store opens and every "
        "started unit its transcripts name has its ledger row"
    )
    return 0
