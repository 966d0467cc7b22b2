"""Connections to the PostgreSQL store: opening them, and saying in one line why one failed.

Every PostgreSQL backend opens its connections and pools here, so a bad url, a refused connection or
wrong credentials read the same everywhere: ``PostgresUnavailable`` with one sentence that
names the server (never the password) and what to check. A pool checks each connection as
it hands it out, so one lost to a server restart is replaced before anyone writes on it.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import psycopg_pool

from delivery.errors import LedgerUnavailable
from storage.postgres.trips import connection_class

# psycopg's parameter style: the mark shared SQL is bound with (``storage.sql.marked``).
PLACEHOLDER = "%s"

CONNECT_TIMEOUT_SECONDS = 10


class PostgresUnavailable(LedgerUnavailable):
    """The PostgreSQL store cannot be reached or used; the message says why, in one line."""


def redact(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[-1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def check_url(url: str) -> None:
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise PostgresUnavailable(f"storage url {redact(url)!r} is not valid: {exc}") from None
    if parts.scheme not in ("postgresql", "postgres"):
        raise PostgresUnavailable(
            f"storage url {redact(url)!r}: expected postgresql://user:password@host/dbname"
        )
    try:
        psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        raise PostgresUnavailable(f"storage url {redact(url)!r} is not valid: {exc}") from None


def explain(exc: BaseException, url: str) -> PostgresUnavailable:
    """One clear line for a failure to connect to (or use) the database at ``url``."""
    text = " ".join(str(exc).split())
    where = redact(url)
    if re.search(
        r"password authentication failed|no password supplied|role .* does not exist", text
    ):
        why = "the server refused the credentials"
    elif re.search(r"database .* does not exist", text):
        why = "the database does not exist"
    elif re.search(r"Connection refused|could not connect|No such file", text):
        why = "nothing accepts connections there (is PostgreSQL running, and the port right?)"
    elif re.search(r"could not translate host name|Name or service not known", text):
        why = "the host name does not resolve"
    elif re.search(r"timeout", text, re.I):
        why = "the connection timed out"
    else:
        why = text or type(exc).__name__
    detail = f" ({text})" if text and why != text else ""
    return PostgresUnavailable(f"cannot use the PostgreSQL store {where}: {why}{detail}")


def connect(url: str, **kwargs: Any) -> psycopg.Connection[Any]:
    """An autocommit connection, or PostgresUnavailable with one clear line."""
    check_url(url)
    try:
        return connection_class().connect(
            url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS, **kwargs
        )
    except psycopg.Error as exc:
        raise explain(exc, url) from None


def open_pool(
    url: str, *, name: str, max_size: int, check: bool = True
) -> psycopg_pool.ConnectionPool[Any]:
    """An open pool of autocommit connections (at least one made before it returns), or
    PostgresUnavailable with one clear line. ``check=False``: connections are handed out
    without the round trip that checks them, for a store that finds a dead one out by
    its own first trip and runs again on a fresh one (``storage.postgres.sessions``)."""
    check_url(url)
    try:
        pool: psycopg_pool.ConnectionPool[Any] = psycopg_pool.ConnectionPool(
            url,
            min_size=1,
            max_size=max(max_size, 1),
            kwargs={"autocommit": True},
            connection_class=connection_class(),
            # A connection the server dropped while it sat in the pool (a restart, a
            # failover, an idle timeout) is found out by one round trip as it is handed out
            # and replaced by a fresh one: the turn after a restart does not fail on it.
            check=psycopg_pool.ConnectionPool.check_connection if check else None,
            open=True,
            timeout=30,
            name=name,
        )
        pool.wait(timeout=15)
    except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
        raise explain(exc, url) from None
    return pool
