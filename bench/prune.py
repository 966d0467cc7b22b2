"""Retention benchmark: the prune rate (rows/s) on N settled ledger rows (1 M by default).

Fills a fresh ledger with N delivered rows settled 40 days ago (each with a 200-byte event
and one audit entry, as a finished delegation has), plus a pending row every 1000 that must
survive, then runs the retention of ``reveille prune`` over it (settled rows only: batches
of ``--batch``, a tombstone written per row) and prints rows/s, the time, and, with SQLite,
the file's size before and after its incremental vacuum. The rows are written with plain
SQL (filling is not what is measured). PostgreSQL runs too when ``--url`` or
``REVEILLE_TEST_PG_URL`` names a server (a fresh schema, dropped afterwards).

Usage: python bench/prune.py [--rows 1000000] [--batch 2000] [--url postgresql://...]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import storage
from delivery.backend import COLUMNS
from delivery.retention import DAY, RetentionPolicy, RetentionStores, run_retention
from storage.sqlite.dialect import SqliteDialect

EVENT = json.dumps({"type": "async_delegation", "status": "completed", "summary": "x" * 200})
CHUNK = 20_000


def _rows(n: int, settled: float) -> Iterator[tuple[list[Any], tuple[Any, ...] | None]]:
    """Each row's values in ``COLUMNS`` order, and its audit entry (None for a pending one)."""
    for i in range(n):
        row_id = f"deleg_{i:012x}"
        pending = i % 1000 == 999
        values: dict[str, Any] = dict.fromkeys(COLUMNS)
        values.update(
            id=row_id,
            kind="delegation",
            state="completed",
            delivery_state="pending" if pending else "delivered",
            session_key="bench",
            request="{}",
            event=EVENT,
            created_at=settled - 60,
            updated_at=settled,
            completed_at=settled - 1,
            claim_expires_at=0 if pending else settled + 300,
            delivery_attempts=0 if pending else 1,
            refunds=0,
            next_attempt_at=0,
            due_at=settled if pending else None,
            settled_at=None if pending else settled,
            restored=0,
        )
        audit = None if pending else (row_id, settled, "complete", "delivered to bench")
        yield [values[c] for c in COLUMNS], audit


def _fill(insert_rows: Any, insert_audit: Any, n: int, settled: float) -> None:
    rows: list[list[Any]] = []
    audits: list[tuple[Any, ...]] = []
    for values, audit in _rows(n, settled):
        rows.append(values)
        if audit is not None:
            audits.append(audit)
        if len(rows) == CHUNK:
            insert_rows(rows)
            insert_audit(audits)
            rows, audits = [], []
    if rows:
        insert_rows(rows)
        insert_audit(audits)


def _file_mb(location: storage.Storage) -> float:
    """The SQLite ledger file's size; 0 for a store that is not a file."""
    dialect = location.dialect
    path = dialect.ledger_path if isinstance(dialect, SqliteDialect) else None
    return path.stat().st_size / 1e6 if path is not None else 0.0


def _prune(location: storage.Storage, batch: int, n: int) -> None:
    location.reclaim_space()  # a checkpoint: the rows are in the file itself, not its log
    size_before = _file_mb(location)
    ledger = location.open_ledger()
    try:
        policy = RetentionPolicy(batch=batch)
        stores = RetentionStores(ledger, reclaim=location.reclaim_space)
        report = run_retention(stores, policy)
        (settled,) = [k for k in report.kinds if k.kind == "settled_ledger_rows"]
        kept = n // 1000
        print(
            f"  pruned {settled.count:,} settled rows in {settled.seconds:.1f} s: "
            f"{settled.rate:,.0f} rows/s (batches of {batch}); {kept:,} pending rows kept"
        )
        if report.space:
            print(
                f"  ledger.db {size_before:,.0f} MB before -> {_file_mb(location):,.1f} MB after"
                " (incremental vacuum; what is left: the kept rows and the tombstones)"
            )
        assert settled.count == n - kept, settled.count
    finally:
        ledger.close()


def bench_sqlite(n: int, batch: int) -> None:
    import sqlite3

    with tempfile.TemporaryDirectory(prefix="reveille-prune-") as home:
        location = storage.open_storage(f"sqlite://{home}")
        location.open_ledger().close()  # the schema, as a server makes it
        conn = sqlite3.connect(Path(home) / "ledger.db", isolation_level=None)
        marks = ", ".join("?" * len(COLUMNS))
        started = time.perf_counter()

        def insert_rows(rows: list[list[Any]]) -> None:
            conn.execute("BEGIN")
            conn.executemany(
                f"INSERT INTO deliveries ({', '.join(COLUMNS)}) VALUES ({marks})", rows
            )
            conn.execute("COMMIT")

        def insert_audit(audits: list[tuple[Any, ...]]) -> None:
            conn.execute("BEGIN")
            conn.executemany(
                "INSERT INTO delivery_audit (delivery_id, at, action, detail) VALUES (?, ?, ?, ?)",
                audits,
            )
            conn.execute("COMMIT")

        _fill(insert_rows, insert_audit, n, time.time() - 40 * DAY)
        conn.close()
        print(f"SQLite: {n:,} rows written in {time.perf_counter() - started:.0f} s")
        _prune(location, batch, n)


def bench_postgres(url: str, n: int, batch: int) -> None:
    import psycopg

    schema = f"bench_prune_{secrets.token_hex(4)}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in url else "?"
    schema_url = f"{url}{sep}options={quote(f'-csearch_path={schema}')}"
    try:
        location = storage.open_storage(schema_url)
        with psycopg.connect(schema_url, autocommit=True) as conn:
            started = time.perf_counter()

            def insert_rows(rows: list[list[Any]]) -> None:
                with (
                    conn.cursor() as cur,
                    cur.copy(f"COPY deliveries ({', '.join(COLUMNS)}) FROM STDIN") as copy,
                ):
                    for row in rows:
                        copy.write_row(row)

            def insert_audit(audits: list[tuple[Any, ...]]) -> None:
                with (
                    conn.cursor() as cur,
                    cur.copy(
                        "COPY delivery_audit (delivery_id, at, action, detail) FROM STDIN"
                    ) as copy,
                ):
                    for audit in audits:
                        copy.write_row(audit)

            _fill(insert_rows, insert_audit, n, time.time() - 40 * DAY)
            conn.execute("ANALYZE deliveries")
            print(f"PostgreSQL: {n:,} rows written in {time.perf_counter() - started:.0f} s")
        _prune(location, batch, n)
    finally:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=RetentionPolicy().batch)
    parser.add_argument("--url", default=os.environ.get("REVEILLE_TEST_PG_URL", ""))
    args = parser.parse_args()
    bench_sqlite(args.rows, args.batch)
    if args.url:
        bench_postgres(args.url, args.rows, args.batch)
    else:
        print("PostgreSQL: skipped (no --url and no REVEILLE_TEST_PG_URL)")


if __name__ == "__main__":
    main()
