"""Backing up and restoring the PostgreSQL store with ``pg_dump`` and ``pg_restore``.

``dump(url, schema, target)`` writes ``target/reveille.pgdump``: the store's schema (every
table: the ledger, the sessions, the rest) in ``pg_dump``'s custom format, taken in ONE
serializable, deferrable transaction, so every table is at the same point of the ledger's
history. The dump is then read back with ``pg_restore --list``, which must find the ledger's
table in it; a dump that fails that is removed.

``load(url, source)`` restores such a dump into a database whose schema holds no Reveille
store yet (``pg_restore --single-transaction``: all or nothing), into the schema it was
taken from.

The password never goes on a command line (other users can read those): the tools get the
url without it and ``PGPASSWORD`` in their environment. When the tools are not installed
``BackupToolMissing`` says so with the manual procedure (``PROCEDURE``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import psycopg

from storage.dialect import BackupToolMissing, BackupUnavailable
from storage.postgres.conn import connect, explain, redact

__all__ = ["DUMP_FILE", "PROCEDURE", "dump", "dump_schema", "load"]

DUMP_FILE = "reveille.pgdump"

PROCEDURE = (
    "back up with `pg_dump --serializable-deferrable --format=custom --schema=SCHEMA "
    f'--file DIR/{DUMP_FILE} "$REVEILLE_DATABASE_URL"` and check the dump with '
    f"`pg_restore --list DIR/{DUMP_FILE}`; restore, while no server runs, into a database "
    "whose schema holds no Reveille store, with `pg_restore --single-transaction --no-owner "
    f'--dbname "$REVEILLE_DATABASE_URL" DIR/{DUMP_FILE}`'
)

_TIMEOUT_SECONDS = 3600.0


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise BackupToolMissing(
            f"{name} is not installed here (Debian: apt-get install postgresql-client, "
            f"the server's major version or newer); {PROCEDURE}"
        )
    return found


def _conninfo(url: str) -> tuple[str, dict[str, str]]:
    """The url without its password, and an environment carrying the password."""
    params = psycopg.conninfo.conninfo_to_dict(url)
    password = params.pop("password", None)
    env = dict(os.environ)
    if password is not None:
        env["PGPASSWORD"] = str(password)
    return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in params.items()}), env


def _run(args: list[str], url: str, env: dict[str, str], doing: str) -> str:
    try:
        done = subprocess.run(
            args, env=env, capture_output=True, text=True, timeout=_TIMEOUT_SECONDS, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackupUnavailable(f"{doing} failed: {exc}") from None
    if done.returncode != 0:
        why = " ".join(done.stderr.split()) or f"exit status {done.returncode}"
        raise BackupUnavailable(f"{doing} failed for {redact(url)}: {why}")
    return done.stdout


def dump_schema(listing: str) -> str | None:
    """The schema of the ledger's table in a ``pg_restore --list`` listing (lines such as
    ``215; 1259 16390 TABLE public deliveries postgres``), or None when it holds none."""
    for line in listing.splitlines():
        if line.startswith(";"):
            continue
        words = line.split()
        for i, word in enumerate(words[:-2]):
            if word == "TABLE" and words[i + 2] == "deliveries":
                return words[i + 1]
    return None


def _verify(path: Path, url: str) -> str:
    _, env = _conninfo(url)
    listing = _run([_tool("pg_restore"), "--list", str(path)], url, env, "pg_restore --list")
    schema = dump_schema(listing)
    if schema is None:
        raise BackupUnavailable(f"{path} holds no Reveille ledger (pg_restore --list)")
    return schema


def dump(url: str, schema: str, target: Path) -> list[str]:
    """Dump the store in ``schema`` to ``target/reveille.pgdump`` and verify it (see the
    module docstring); what was written."""
    pg_dump = _tool("pg_dump")
    _tool("pg_restore")  # the check needs it too: refuse before dumping, not after
    conninfo, env = _conninfo(url)
    path = target / DUMP_FILE
    args = [
        pg_dump,
        "--serializable-deferrable",  # one snapshot that no serialization conflict breaks
        "--format=custom",
        f"--schema={schema}",
        f"--file={path}",
        f"--dbname={conninfo}",
    ]
    try:
        _run(args, url, env, "pg_dump")
        os.chmod(path, 0o600)
        _verify(path, url)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return [DUMP_FILE]


def load(url: str, source: Path) -> list[str]:
    """Restore ``source/reveille.pgdump`` into the database at ``url``, whose schema must
    hold no Reveille store yet; what was restored."""
    path = source / DUMP_FILE
    if not path.is_file():
        raise BackupUnavailable(f"{source} holds no {DUMP_FILE}; nothing was restored")
    pg_restore = _tool("pg_restore")
    schema = _verify(path, url)
    conn = connect(url)
    try:
        row = conn.execute(
            "SELECT to_regclass(quote_ident(%s) || '.reveille_schema') IS NOT NULL", (schema,)
        ).fetchone()
    except psycopg.Error as exc:
        raise explain(exc, url) from None
    finally:
        conn.close()
    if row is not None and row[0]:
        raise BackupUnavailable(
            f"schema {schema} of {redact(url)} holds a Reveille store already: restore into "
            "an empty one (drop the schema, or name another database); nothing was restored"
        )
    conninfo, env = _conninfo(url)
    args = [
        pg_restore,
        "--single-transaction",  # all of it or nothing
        "--exit-on-error",
        "--no-owner",  # the restoring role owns what it creates
        f"--dbname={conninfo}",
        str(path),
    ]
    _run(args, url, env, "pg_restore")
    return [DUMP_FILE]
