"""`reveille backup DIR` and `reveille restore DIR`: a copy of every store of a state directory.

A backup is taken online, while servers run: each SQLite file (the ledger, the session
store, the web UI's state, the Responses API's responses, Telegram's state) is copied with
SQLite's backup API, which gives a consistent snapshot of that file; the background
processes' outputs are copied as files. The copy is private: the directory 0700, every file
0600. With PostgreSQL the database is not in the state directory: the command says to use
``pg_dump`` for it and copies what is local.

A restore goes into an empty (or new) state directory only, and checks that every store it
copied opens there before it says so. A restored ledger's pending deliveries are offered
when a server starts on it, each delivered once (the sinks are idempotent by delivery id).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import sys
from pathlib import Path
from typing import Any

from delivery.state_dir import ensure_private_dir
from gateway.platforms.telegram_state import STATE_FILE as TELEGRAM_FILE
from reveille.settings import load_settings
from storage.opener import (
    LEDGER_FILE,
    RESPONSES_FILE,
    SESSIONS_FILE,
    WEBUI_FILE,
    open_storage,
)
from tools.background_processes import PROCESSES_DIR

__all__ = ["STORE_FILES", "add_parsers", "backup", "restore"]

STORE_FILES = (LEDGER_FILE, SESSIONS_FILE, WEBUI_FILE, RESPONSES_FILE, TELEGRAM_FILE)


class BackupError(Exception):
    """The backup or restore cannot be made (the message says why)."""


def add_parsers(subparsers: Any) -> None:
    b = subparsers.add_parser("backup", help="copy every store of the state directory to DIR")
    b.add_argument("dir", help="a new or empty directory")
    b.set_defaults(func=_run_backup)
    r = subparsers.add_parser("restore", help="restore a backup into an empty state directory")
    r.add_argument("dir", help="a directory made by `reveille backup`")
    r.set_defaults(func=_run_restore)


def _empty_private_dir(path: Path) -> None:
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise BackupError(f"{path} is not an empty directory; nothing was written")
    ensure_private_dir(path)


def _copy_sqlite(source: Path, target: Path) -> None:
    """An online, consistent copy of one SQLite file, readable by this user only."""
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    dst = sqlite3.connect(target)
    try:
        src.backup(dst)
        dst.execute("PRAGMA journal_mode = DELETE")  # one self-contained file
    finally:
        dst.close()
        src.close()


def _copy_tree(source: Path, target: Path) -> None:
    shutil.copytree(source, target, copy_function=shutil.copy2)
    for root, dirs, files in os.walk(target):
        os.chmod(root, 0o700)
        for name in files:
            os.chmod(os.path.join(root, name), 0o600)
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o700)


def backup(home: Path, target: Path) -> list[str]:
    """Copy the stores of ``home`` into the new or empty ``target``; what was copied."""
    if not home.is_dir():
        raise BackupError(f"state directory {home} does not exist")
    _empty_private_dir(target)
    copied = []
    for name in STORE_FILES:
        if (home / name).is_file():
            _copy_sqlite(home / name, target / name)
            copied.append(name)
    if (home / PROCESSES_DIR).is_dir():
        _copy_tree(home / PROCESSES_DIR, target / PROCESSES_DIR)
        copied.append(PROCESSES_DIR + "/")
    return copied


def restore(source: Path, home: Path) -> list[str]:
    """Copy a backup into the new or empty state directory ``home`` and check that every
    store opens there; what was restored."""
    names = [n for n in STORE_FILES if (source / n).is_file()]
    if not names:
        raise BackupError(f"{source} holds no Reveille store; nothing was written")
    _empty_private_dir(home)
    for name in names:
        _copy_sqlite(source / name, home / name)
    if (source / PROCESSES_DIR).is_dir():
        _copy_tree(source / PROCESSES_DIR, home / PROCESSES_DIR)
        names.append(PROCESSES_DIR + "/")
    storage = open_storage(f"sqlite://{home.resolve()}")
    if LEDGER_FILE in names:
        storage.open_ledger().close()
    if SESSIONS_FILE in names:
        storage.open_sessions().close()
    if WEBUI_FILE in names:
        storage.open_webui().close()
    if RESPONSES_FILE in names:
        storage.open_responses().close()
    return names


def _run_backup(args: argparse.Namespace) -> int:
    settings = load_settings()
    try:
        copied = backup(settings.home, Path(args.dir).expanduser())
    except (BackupError, OSError, sqlite3.Error) as exc:
        print(f"reveille backup: {exc}", file=sys.stderr)
        return 1
    print(f"copied {', '.join(copied) or 'nothing'} from {settings.home} to {args.dir}")
    if settings.database_url:
        print(
            "the ledger and the sessions are in PostgreSQL: back the database up with "
            "`pg_dump --format=custom` (and check it with `pg_restore --list`)"
        )
    return 0


def _run_restore(args: argparse.Namespace) -> int:
    settings = load_settings()
    try:
        restored = restore(Path(args.dir).expanduser(), settings.home)
    except Exception as exc:  # a copy that does not open is reported, in one line
        print(f"reveille restore: {exc}", file=sys.stderr)
        return 1
    print(f"restored {', '.join(restored)} into {settings.home}; every store opens")
    return 0
