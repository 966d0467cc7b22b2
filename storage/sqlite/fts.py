"""The full-text indexes of the SQLite stores (messages' text, the ledger's goals): one FTS5
index over one text column of a table, and the query text of a search's words.

Each index is external content (the text is kept once, in its table) and kept in step by
triggers in the same transaction as every insert, delete and change of that column, so it
can never hold what the table no longer says. It keys on the table's integer row key; a
file made before the index existed gets it, with every row already there, once, on open
(``TextIndex.add_to``).

An index that only answers ``MATCH`` (no ``snippet``, no ranking) keeps no column sizes
(``column_sizes=False``, FTS5's ``columnsize = 0``): each insert then writes one page less
(its ``_docsize`` row). A file whose index has them gets it rebuilt without, once, on open.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

from storage.sqlite import files as sqlite_files

__all__ = ["TextIndex", "fts_query"]

_NO_COLUMN_SIZES = "columnsize = 0"


@dataclass(frozen=True, slots=True)
class TextIndex:
    """An FTS5 index ``name`` over ``table.column``, keyed on ``table.key`` (an integer
    primary key, or the rowid, which VACUUM keeps: its transfer copies rowids as they are)."""

    name: str
    table: str
    column: str
    key: str = "rowid"
    column_sizes: bool = True

    @property
    def ddl(self) -> str:
        """The index and its three triggers."""
        n, t, c, k = self.name, self.table, self.column, self.key
        forget = f"INSERT INTO {n} ({n}, rowid, {c}) VALUES ('delete', old.{k}, old.{c});"
        learn = f"INSERT INTO {n} (rowid, {c}) VALUES (new.{k}, new.{c});"
        sizes = "" if self.column_sizes else f", {_NO_COLUMN_SIZES}"
        return f"""
CREATE VIRTUAL TABLE {n} USING fts5(
    {c}, content = '{t}', content_rowid = '{k}', tokenize = 'unicode61'{sizes}
);
CREATE TRIGGER {n}_insert AFTER INSERT ON {t} BEGIN
    {learn}
END;
CREATE TRIGGER {n}_delete AFTER DELETE ON {t} BEGIN
    {forget}
END;
CREATE TRIGGER {n}_update AFTER UPDATE OF {c} ON {t} BEGIN
    {forget}
    {learn}
END;
"""

    @property
    def fill(self) -> str:
        """Index every row the table holds (FTS5's ``rebuild``)."""
        return f"INSERT INTO {self.name} ({self.name}) VALUES ('rebuild')"

    @property
    def drop(self) -> str:
        """Remove the index and its triggers (to build it again in a newer form)."""
        n = self.name
        triggers = "".join(
            f"DROP TRIGGER IF EXISTS {n}_{w};" for w in ("insert", "delete", "update")
        )
        return f"{triggers}DROP TABLE IF EXISTS {n};"

    def add_to(self, conn: sqlite3.Connection, spec: sqlite_files.SqliteFile) -> None:
        """Give an older file this index with its rows already indexed, or the index it has
        in the form this one asks for, once (a file that has it takes no write lock)."""
        current = None if self.column_sizes else _NO_COLUMN_SIZES
        sqlite_files.add_once(
            conn, spec, self.name, self.ddl, self.fill, current=current, drop=self.drop
        )


def fts_query(terms: Sequence[str]) -> str:
    """An FTS5 query in which every term must start a word: each a quoted prefix (terms are
    letters and digits only, ``search_terms``, so none can close its quotes)."""
    return " ".join(f'"{term}"*' for term in terms)
