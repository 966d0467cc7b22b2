"""SQLite file plumbing shared by every store that keeps a SQLite file (ledger, session store).

Nothing here knows what the file holds. A caller describes its file once with a
``SqliteFile`` and uses four functions:

``SqliteFile(path, name, application_id, schema_version, errors, busy_timeout_ms=5000,
synchronous="FULL", foreign_keys=True)``
    ``path`` is resolved to an absolute path. ``name`` is the human name used in messages
    ("ledger", "session store"). ``application_id`` marks the file as the caller's
    (``PRAGMA application_id``); None skips that check (for stores whose older files carry
    no mark; they use ``extra_check`` instead). ``schema_version`` is the newest
    ``PRAGMA user_version`` the caller understands. ``errors`` is a ``FileErrors``: which of
    the caller's exception classes to raise for each failure.

``FileErrors(not_ours, unavailable, too_new=None)``
    ``not_ours(msg)``: the path is a directory, not a SQLite database, or another program's
    database; it was left untouched. ``unavailable(msg)``: cannot be opened or used now
    (locked past the busy timeout, permissions, I/O). ``too_new(msg)``: the schema is newer
    than the caller understands (defaults to ``not_ours``).

``create_private(spec) -> None``
    Creates missing parent directories 0700 and the file itself 0600 with ``O_EXCL`` before
    SQLite ever opens it (SQLite gives the ``-wal``/``-shm`` side files the main file's
    mode); an existing file is left alone; a directory at the path is refused.

``connect(spec, *, check_owner=False, extra_check=None) -> sqlite3.Connection``
    An autocommit connection (``isolation_level=None``, ``check_same_thread=False``) with
    ``busy_timeout``, ``auto_vacuum=INCREMENTAL`` (takes effect on a new file only),
    ``journal_mode=WAL``, ``synchronous`` and ``foreign_keys``. With
    ``check_owner`` the ownership checks run BEFORE any pragma that writes, so a foreign or
    newer file is refused unmodified: the application id (when set; a file with no tables
    counts as new and is ours), then ``user_version <= schema_version``, then
    ``extra_check(conn)`` if given (it raises the caller's error to refuse).

``stamp_schema(conn, spec, ddl) -> None``
    Runs ``ddl`` (a script of ``CREATE ... IF NOT EXISTS``) and sets ``application_id`` (when
    set) and ``user_version`` in one ``BEGIN IMMEDIATE`` transaction (under the file's
    ``WriteLock``, as ``add_once`` and ``reclaim`` are), so two processes creating the same
    new file cannot interleave.

``add_once(conn, spec, table, script, fill, *, current=None, drop="") -> None``
    Gives an older file a table its schema gained later (with the triggers that keep it,
    ``script``) and fills it from the rows already there (``fill``), in one transaction
    that looks again first: two processes opening the same older file build it once. A
    file that has ``table`` takes no write lock (the usual case). With ``current``, a
    table whose ``CREATE`` lacks that text is an older form: ``drop`` removes it (and its
    triggers) and it is built again the same way.

``reclaim(spec, *, convert=False) -> SpaceReport``
    Gives the pages freed by deletes back to the file system: ``PRAGMA incremental_vacuum``
    and a truncating checkpoint of the log. A file made before incremental vacuum was set up
    (``auto_vacuum`` NONE) is switched by one ``VACUUM`` when ``convert`` (it rewrites the
    whole file: an operator's moment, ``reveille prune``), and otherwise left as it is.

``classify(exc, spec, doing) -> Exception``
    The caller's exception for a ``sqlite3.Error``: ``not_ours`` when the file is not a
    database (or encrypted), ``unavailable`` otherwise. ``doing`` names the action for the
    message ("open", "read").
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from delivery.retention import SpaceReport
from delivery.state_dir import tighten
from storage.sqlite.write_lock import WriteLock

# sqlite3's parameter style: the mark shared SQL is bound with (``storage.sql.marked``).
PLACEHOLDER = "?"

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FileErrors:
    """The caller's exception classes (each built from one message string)."""

    not_ours: Callable[[str], Exception]
    unavailable: Callable[[str], Exception]
    too_new: Callable[[str], Exception] | None = None


@dataclass(frozen=True, slots=True)
class SqliteFile:
    """What a store's SQLite file is: where, whose, which schema, which errors to raise."""

    path: str
    name: str
    application_id: int | None
    schema_version: int
    errors: FileErrors
    busy_timeout_ms: int = 5000
    synchronous: str = "FULL"
    foreign_keys: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", str(Path(self.path).expanduser().resolve()))
        if self.synchronous.upper() not in {"OFF", "NORMAL", "FULL", "EXTRA"}:
            raise ValueError(f"unknown synchronous level {self.synchronous!r}")


def create_private(spec: SqliteFile) -> None:
    """Create the parents 0700 and the file 0600 (O_EXCL); refuse a directory.

    An existing file (and its ``-wal``/``-shm``) that others may read is tightened to 0600
    when this user owns it; SQLite gives the log files the database file's mode.
    """
    path = spec.path
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        if os.path.isdir(path):
            raise spec.errors.not_ours(
                f"{path} is a directory, not a {spec.name} database; it was left untouched"
            )
        with contextlib.suppress(FileExistsError):
            # Born 0600 (private conversations, results): SQLite would use the umask.
            os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
        for name in (path, path + "-wal", path + "-shm"):
            tighten(name, 0o600)
    except OSError as exc:
        raise spec.errors.unavailable(f"cannot create the {spec.name} {path}: {exc}") from exc


def is_not_a_database(exc: BaseException) -> bool:
    text = str(exc)
    return "not a database" in text or "file is encrypted" in text


def classify(exc: sqlite3.Error, spec: SqliteFile, doing: str = "open") -> Exception:
    """The caller's exception for a SQLite error (not a database vs unavailable)."""
    if isinstance(exc, sqlite3.DatabaseError) and is_not_a_database(exc):
        return spec.errors.not_ours(
            f"{spec.path} exists but is not a SQLite database; it was left untouched"
        )
    return spec.errors.unavailable(f"cannot {doing} the {spec.name} {spec.path}: {exc}")


@contextlib.contextmanager
def immediate(conn: sqlite3.Connection, spec: SqliteFile) -> Iterator[sqlite3.Connection]:
    """One ``BEGIN IMMEDIATE`` transaction on ``conn``: committed when the block ends,
    rolled back when it raises; a SQLite error is classified (``classify``) for ``spec``.
    The caller holds whatever lock guards ``conn``."""
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        if conn.in_transaction:
            conn.rollback()
        raise classify(exc, spec, "use") from exc


def check_owner(conn: sqlite3.Connection, spec: SqliteFile) -> None:
    """Refuse another program's file or a newer schema; reads only, writes nothing."""
    # A read first: on a foreign non-SQLite file this fails with "not a database".
    tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    if spec.application_id is not None:
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        if app_id != spec.application_id and tables:
            raise spec.errors.not_ours(
                f"{spec.path} is a SQLite database of something else (application_id "
                f"{app_id:#x}); it was left untouched"
            )
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > spec.schema_version:
        too_new = spec.errors.too_new or spec.errors.not_ours
        raise too_new(
            f"{spec.path} has {spec.name} schema {version}, newer than this Reveille "
            f"understands ({spec.schema_version}); upgrade Reveille instead of downgrading "
            "the data"
        )


def connect(
    spec: SqliteFile,
    *,
    check_owner: bool = False,
    extra_check: Callable[[sqlite3.Connection], None] | None = None,
) -> sqlite3.Connection:
    """Open a connection with the pragmas; with ``check_owner``, ownership checks first."""
    try:
        conn = sqlite3.connect(
            spec.path,
            timeout=spec.busy_timeout_ms / 1000,
            isolation_level=None,  # explicit BEGIN/COMMIT, no implicit transactions
            check_same_thread=False,  # callers confine or lock their connections
        )
    except sqlite3.Error as exc:
        raise classify(exc, spec) from exc
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(spec.busy_timeout_ms)}")
        if check_owner:
            # Before any pragma that writes: switching another program's file to WAL
            # would already be a modification.
            _check_owner(conn, spec)
            if extra_check is not None:
                extra_check(conn)
        # Before WAL: switching to WAL writes the header, after which a new file can no
        # longer change its vacuum mode. On an existing file this writes nothing.
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
        _set_wal(conn, spec.busy_timeout_ms / 1000)
        conn.execute(f"PRAGMA synchronous = {spec.synchronous.upper()}")
        if spec.foreign_keys:
            conn.execute("PRAGMA foreign_keys = ON")
    except sqlite3.Error as exc:
        conn.close()
        raise classify(exc, spec) from exc
    except BaseException:
        conn.close()
        raise
    return conn


def _size(path: str) -> int:
    return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))


def reclaim(spec: SqliteFile, *, convert: bool = False) -> SpaceReport:
    """Free the deleted pages of the file (see the module docstring)."""
    before = _size(spec.path)
    conn = connect(spec)
    converted = False
    lock = WriteLock(spec.path)  # the vacuum writes: queued with the file's other writers
    try:
        with lock:
            mode = conn.execute("PRAGMA auto_vacuum").fetchone()[0]
            if mode != 2 and convert:
                conn.execute("VACUUM")  # applies the INCREMENTAL that ``connect`` asked for
                converted = True
            elif mode == 2:
                # executescript steps the pragma to its end; execute() would free one page.
                conn.executescript("PRAGMA incremental_vacuum;")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            mode = conn.execute("PRAGMA auto_vacuum").fetchone()[0]
    except sqlite3.Error as exc:
        raise classify(exc, spec, "reclaim space in") from exc
    finally:
        lock.close()
        conn.close()
    return SpaceReport(spec.path, before, _size(spec.path), converted, mode != 2)


def reclaim_file(path: str | os.PathLike[str], name: str, *, convert: bool) -> SpaceReport:
    """``reclaim`` on a file named by path alone (the opener's, for every store's file)."""
    from delivery.errors import LedgerUnavailable

    errors = FileErrors(not_ours=LedgerUnavailable, unavailable=LedgerUnavailable)
    return reclaim(SqliteFile(str(path), name, None, 1 << 30, errors), convert=convert)


def _set_wal(conn: sqlite3.Connection, timeout: float) -> None:
    """``journal_mode = WAL``, waiting out a process that is creating the same file: the
    switch needs the file to itself, and SQLite answers "locked" at once instead of calling
    the busy handler (two servers starting together on a fresh state directory)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL").fetchone()
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


# ``connect``'s keyword shadows the function inside it
_check_owner = check_owner


def stamp_schema(conn: sqlite3.Connection, spec: SqliteFile, ddl: str) -> None:
    """Create the schema and mark the file, in one transaction."""
    marks = f"PRAGMA user_version = {int(spec.schema_version)};"
    if spec.application_id is not None:
        marks = f"PRAGMA application_id = {int(spec.application_id)};" + marks
    with _write_locked(conn, spec):
        conn.executescript(f"BEGIN IMMEDIATE;{ddl};{marks}COMMIT;")


@contextlib.contextmanager
def _write_locked(conn: sqlite3.Connection, spec: SqliteFile) -> Iterator[None]:
    """The block begins and commits a write transaction under the file's ``WriteLock``
    (queued with the file's other writers: workers starting beside busy ones); a SQLite
    error rolls it back, still under the lock, and is classified."""
    lock = WriteLock(spec.path)
    try:
        with lock:
            try:
                yield
            except sqlite3.Error as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise classify(exc, spec) from exc
    finally:
        lock.close()


_TABLE_SQL = "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?"


def add_once(
    conn: sqlite3.Connection,
    spec: SqliteFile,
    table: str,
    script: str,
    fill: str,
    *,
    current: str | None = None,
    drop: str = "",
) -> None:
    """Create ``table`` by ``script`` and run ``fill``, once, or build it again where it
    has an older form (see the module docstring)."""

    def found() -> str | None:
        """What stands in the way: "missing", "older", or None when ``table`` is current."""
        row = conn.execute(_TABLE_SQL, (table,)).fetchone()
        if row is None:
            return "missing"
        return "older" if current is not None and current not in (row[0] or "") else None

    try:
        if found() is None:
            return
    except sqlite3.Error as exc:
        raise classify(exc, spec) from exc
    with _write_locked(conn, spec):
        conn.execute("BEGIN IMMEDIATE")
        state = found()  # again under the lock: another process may have just done it
        if state is not None:
            if state == "older":
                for statement in statements(drop):
                    conn.execute(statement)
            for statement in statements(script):
                conn.execute(statement)
            conn.execute(fill)
        conn.execute("COMMIT")


def statements(script: str) -> list[str]:
    """A script's statements, a trigger's body (``BEGIN ... END;``) kept whole."""
    out: list[str] = []
    current = ""
    for piece in script.split(";"):
        current += piece + ";"
        if sqlite3.complete_statement(current):
            if current.strip(" \n;"):
                out.append(current.strip())
            current = ""
    return out
