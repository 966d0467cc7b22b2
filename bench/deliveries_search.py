"""The Deliveries page's goal search on a large SQLite ledger: latency through the FTS5 index.

Builds a ledger of N rows (default 100,000) through the real backend's schema and triggers,
with goals drawn from a vocabulary of a few thousand words, one old row whose goal says
"nightly backup", and then times ``LedgerViews.query(RowQuery(text=..., limit=200))`` (what
the page and ``reveille deliveries list --search`` run) for a few kinds of search:

  * a rare word held by one old row, whole and as a prefix ("back");
  * two words held together by one row;
  * a common word held by about a tenth of the rows (the newest 200 of them);
  * one letter, the prefix of a word in a third of the goals (a search box being typed in);
  * a word no goal holds;
  * a common word with a delivery-state filter.

Prints p50/p99 milliseconds for each, and how long opening a version-4 file of the same
rows takes (the upgrade that indexes the rows already there).

Usage: python bench/deliveries_search.py [--rows 100000] [--repeat 200]
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import storage
from delivery.rows import RowQuery

_INSERT = (
    "INSERT INTO deliveries (id, kind, state, delivery_state, session_key, goal, created_at,"
    " updated_at) VALUES (?, 'delegation', 'completed', ?, ?, ?, ?, ?)"
)


def _vocabulary(rng: random.Random, size: int) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    words: set[str] = set()
    while len(words) < size:
        words.add("".join(rng.choice(letters) for _ in range(rng.randint(4, 10))))
    return sorted(words)


def build(path: Path, rows: int) -> None:
    """A ledger of ``rows`` rows, written through the backend's own schema and triggers."""
    storage.sqlite_files(ledger=path).open_ledger().close()
    rng = random.Random(7)
    words = _vocabulary(rng, 5000)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    t0 = 1_700_000_000.0
    for i in range(rows):
        if i == 10:
            goal = "nightly backup of /srv/data to s3://bucket.example.com"
        else:
            goal = " ".join(rng.choice(words) for _ in range(rng.randint(4, 14)))
            if i % 10 == 0:
                goal += " report"  # the common word: a tenth of the rows
            if rng.random() < 0.3:
                goal += f" /home/user/{rng.choice(words)}/{rng.choice(words)}.txt"
        state = "pending" if i % 50 == 0 else "delivered"
        conn.execute(
            _INSERT, (f"deleg_{i:08d}", state, f"agent:main:webui:s{i % 500}", goal, t0 + i, t0 + i)
        )
    conn.execute("COMMIT")
    conn.close()


def _ms(samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"p50 {statistics.median(ordered) * 1000:7.2f} ms   p99 {p99 * 1000:7.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ledger.db"
        started = time.perf_counter()
        build(path, args.rows)
        print(f"ledger of {args.rows:,} rows built in {time.perf_counter() - started:.1f} s")
        backend = storage.sqlite_files(ledger=path).open_ledger()
        searches = {
            "rare word (1 old row)": RowQuery(text="backup", limit=200),
            "rare prefix 'back'": RowQuery(text="back", limit=200),
            "two words, one row": RowQuery(text="nightly srv", limit=200),
            "common word (1/10 of rows)": RowQuery(text="report", limit=200),
            "one letter 'a' (1/3 of rows)": RowQuery(text="a", limit=200),
            "no match": RowQuery(text="zzzzqqq", limit=200),
            "common word, pending only": RowQuery(
                text="report", delivery_state="pending", limit=200
            ),
        }
        try:
            for name, query in searches.items():
                found = len(backend.query(query))  # warm the page cache once
                samples = []
                for _ in range(args.repeat):
                    t = time.perf_counter()
                    backend.query(query)
                    samples.append(time.perf_counter() - t)
                print(f"{name:<28} {found:>4} rows   {_ms(samples)}")
        finally:
            backend.close()

        # The upgrade: a version-4 file of the same rows gains its index on open.
        raw = sqlite3.connect(path, isolation_level=None)
        raw.executescript(
            "DROP TRIGGER deliveries_fts_insert; DROP TRIGGER deliveries_fts_delete;"
            "DROP TRIGGER deliveries_fts_update; DROP TABLE deliveries_fts;"
            "PRAGMA user_version = 4;"
        )
        raw.close()
        started = time.perf_counter()
        backend = storage.sqlite_files(ledger=path).open_ledger()
        elapsed = time.perf_counter() - started
        try:
            assert [r.id for r in backend.query(RowQuery(text="backup"))] == ["deleg_00000010"]
        finally:
            backend.close()
        print(f"a version-4 file of {args.rows:,} rows indexed on open in {elapsed:.2f} s")


if __name__ == "__main__":
    main()
