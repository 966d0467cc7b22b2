"""A PostgreSQL store of its own for each test: a fresh schema in the test server's database.

``REVEILLE_TEST_PG_URL`` names the server (``scripts/pg-test-server start`` prints it). Each
``fresh_url()`` creates a new schema and returns the url with ``search_path`` set to it, so
tests never see each other's rows, migrations or wake-ups. Without the variable the
PostgreSQL tests skip, except in CI (``CI`` set), where a missing server is a failure.
"""

from __future__ import annotations

import atexit
import os
import secrets
from urllib.parse import quote

import pytest

PG_URL = os.environ.get("REVEILLE_TEST_PG_URL", "")
_created: list[str] = []


def require_pg() -> str:
    if not PG_URL:
        if os.environ.get("CI"):
            pytest.fail("CI is set but REVEILLE_TEST_PG_URL is not: PostgreSQL tests must run")
        pytest.skip("no PostgreSQL test server (set REVEILLE_TEST_PG_URL)")
    return PG_URL


def url_for_schema(schema: str) -> str:
    sep = "&" if "?" in PG_URL else "?"
    # Commits need not wait for the disk in tests (nothing here survives a power cut);
    # bench/ledger_pg.py measures at synchronous_commit=on.
    options = f"-csearch_path={schema} -csynchronous_commit=off"
    return f"{PG_URL}{sep}options={quote(options)}"


def fresh_url() -> str:
    """The url of a new, empty schema (dropped when the test run ends)."""
    import psycopg

    require_pg()
    schema = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    _created.append(schema)
    return url_for_schema(schema)


@atexit.register
def _drop_schemas() -> None:
    if not _created:
        return
    import psycopg

    try:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            for schema in _created:
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    except psycopg.Error:
        pass
