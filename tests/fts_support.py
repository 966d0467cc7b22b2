"""What the SQLite stores' text index tests read from a file directly: a batched index's mark
and tail, and FTS5's own check of an index against its table."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from storage.sqlite.fts import TextIndex


def indexed(path: Path, index: TextIndex) -> tuple[int, int]:
    """A batched ``index``'s mark (the highest key indexed) and how many rows of its table
    lie above it (the tail)."""
    raw = sqlite3.connect(path)
    try:
        (upto,) = raw.execute(f"SELECT upto FROM {index.mark}").fetchone()
        (tail,) = raw.execute(
            f"SELECT count(*) FROM {index.table} WHERE {index.key} > ?", (upto,)
        ).fetchone()
        return int(upto), int(tail)
    finally:
        raw.close()


def index_intact(path: Path, index: TextIndex) -> None:
    """FTS5's integrity check of ``index`` against its table, its external content (rank 1
    compares them): raises ``sqlite3.DatabaseError`` where they differ."""
    raw = sqlite3.connect(path)
    try:
        raw.execute(f"INSERT INTO {index.name} ({index.name}, rank) VALUES ('integrity-check', 1)")
    finally:
        raw.close()
