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

A ``batched`` index takes new rows in batches instead of in each insert's transaction
(every insert wrote two to three pages of the index into the log, fsynced with the row):
a one-row table ``<name>_mark`` holds the highest key indexed, every row at or below it is
in the index, and the rows above it (the tail) are indexed by ``tail``'s statements, which
the store runs off the writers' path and before a search, so a search never misses a row. The
triggers act only on rows at or below the mark (a row above it is read as it is when the
tail is indexed); an insert at or below it (a key reused after a delete) is indexed at once.
A file with the per-insert triggers gets the guarded ones and its mark, once, on open, its
index kept as it is. ``BatchedIndexing`` is a batched index's upkeep on its file's writer:
the tail indexed every ``batch`` rows inserted, and before a search.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from storage.sqlite import files as sqlite_files
from storage.sqlite.writer import GroupCommitWriter

__all__ = ["BatchedIndexing", "TextIndex", "fts_query"]

C = TypeVar("C")

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
    batched: bool = False

    @property
    def mark(self) -> str:
        """The table of a batched index's mark: the highest key indexed."""
        return f"{self.name}_mark"

    @property
    def ddl(self) -> str:
        """The index and its three triggers (and a batched index's mark, at the table's
        highest key: ``fill`` indexes every row there is)."""
        n, t, c, k = self.name, self.table, self.column, self.key
        sizes = "" if self.column_sizes else f", {_NO_COLUMN_SIZES}"
        index = f"""
CREATE VIRTUAL TABLE {n} USING fts5(
    {c}, content = '{t}', content_rowid = '{k}', tokenize = 'unicode61'{sizes}
);"""
        mark = f"\n{self._mark_table}\n{self._mark_at_last};" if self.batched else ""
        return index + mark + self._triggers

    @property
    def _mark_table(self) -> str:
        return (
            f"CREATE TABLE IF NOT EXISTS {self.mark}"
            " (id INTEGER PRIMARY KEY CHECK (id = 0), upto INTEGER NOT NULL);"
        )

    @property
    def _mark_at_last(self) -> str:
        """Set a batched index's mark at the table's last row (all of them indexed)."""
        t, k = self.table, self.key
        return (
            f"INSERT OR REPLACE INTO {self.mark} (id, upto)"
            f" VALUES (0, coalesce((SELECT max({k}) FROM {t}), 0))"
        )

    @property
    def _triggers(self) -> str:
        n, t, c, k = self.name, self.table, self.column, self.key
        forget = f"INSERT INTO {n} ({n}, rowid, {c}) VALUES ('delete', old.{k}, old.{c});"
        learn = f"INSERT INTO {n} (rowid, {c}) VALUES (new.{k}, new.{c});"
        new_in = old_in = ""
        if self.batched:  # only the rows the index holds; the tail is indexed as it is then
            upto = f"(SELECT upto FROM {self.mark})"
            new_in, old_in = f" WHEN new.{k} <= {upto}", f" WHEN old.{k} <= {upto}"
        return f"""
CREATE TRIGGER {n}_insert AFTER INSERT ON {t}{new_in} BEGIN
    {learn}
END;
CREATE TRIGGER {n}_delete AFTER DELETE ON {t}{old_in} BEGIN
    {forget}
END;
CREATE TRIGGER {n}_update AFTER UPDATE OF {c} ON {t}{old_in} BEGIN
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
        return f"{self._drop_triggers}DROP TABLE IF EXISTS {self.name};" + (
            f"DROP TABLE IF EXISTS {self.mark};" if self.batched else ""
        )

    @property
    def _drop_triggers(self) -> str:
        n = self.name
        return "".join(f"DROP TRIGGER IF EXISTS {n}_{w};" for w in ("insert", "delete", "update"))

    @property
    def tail(self) -> tuple[str, str]:
        """A batched index's two statements that index the rows above its mark and move the
        mark to the last of them (one transaction; the first one's row count is the rows
        indexed)."""
        n, t, c, k, mark = self.name, self.table, self.column, self.key, self.mark
        last = f"(SELECT max({k}) FROM {t})"
        return (
            f"INSERT INTO {n} (rowid, {c}) SELECT {k}, {c} FROM {t}"
            f" WHERE {k} > (SELECT upto FROM {mark}) ORDER BY {k}",
            f"UPDATE {mark} SET upto = {last} WHERE {last} > upto",
        )

    @property
    def has_tail(self) -> str:
        """A query: 1 when rows above a batched index's mark wait to be indexed, else 0."""
        return (
            f"SELECT EXISTS (SELECT 1 FROM {self.table}"
            f" WHERE {self.key} > (SELECT upto FROM {self.mark}))"
        )

    def add_to(self, conn: sqlite3.Connection, spec: sqlite_files.SqliteFile) -> None:
        """Give an older file this index with its rows already indexed, or the index it has
        in the form this one asks for, once (a file that has it takes no write lock). A
        batched index whose file has only the per-insert triggers keeps its index (it holds
        every row) and gets the guarded triggers with its mark at the table's last row."""
        current = None if self.column_sizes else _NO_COLUMN_SIZES
        sqlite_files.add_once(
            conn, spec, self.name, self.ddl, self.fill, current=current, drop=self.drop
        )
        if self.batched:
            sqlite_files.add_once(
                conn,
                spec,
                self.mark,
                self._drop_triggers + self._mark_table + self._triggers,
                self._mark_at_last,
            )


class BatchedIndexing(Generic[C]):
    """A batched ``index``'s upkeep on the ``GroupCommitWriter`` of its file, whose operations
    get a context ``C`` (``execute`` runs a statement on its connection).

    The writer's operations report the rows they inserted (``inserted``); once every
    ``batch`` rows the tail's indexing is queued for the writer thread, so the insert that
    filled the batch does not wait for it and nobody waits for its outcome (a failure
    leaves the rows to the next batch). ``index_now`` indexes what is left and waits for it,
    when ``has_tail`` (a query on a reader connection) says there is a tail: before a
    search, and before the file closes. Both commit without an fsync: the index and its
    mark are lost together in a power cut, and the rows are indexed again.

    ``writer`` is set once the writer exists (the context of its operations is built with
    ``inserted``)."""

    def __init__(
        self,
        index: TextIndex,
        *,
        batch: int,
        execute: Callable[[C, str], sqlite3.Cursor],
        has_tail: Callable[[str], bool],
        unavailable: type[Exception],
    ) -> None:
        self.index = index
        self.writer: GroupCommitWriter[C] | None = None
        self._batch = batch
        self._execute = execute
        self._has_tail = has_tail
        self._unavailable = unavailable
        self._inserted = 0  # by the writer's operations, which run one at a time

    def index_tail(self, context: C) -> int:
        """Index the tail, in the operation's transaction: how many rows."""
        indexed = int(self._execute(context, self.index.tail[0]).rowcount)
        self._execute(context, self.index.tail[1])
        return indexed

    def inserted(self, rows: int) -> None:
        """A writer's operation inserted ``rows`` rows into the indexed table."""
        before = self._inserted
        self._inserted += rows
        if before // self._batch == self._inserted // self._batch or self.writer is None:
            return
        # Never fails the insert that calls it: a writer closing meanwhile leaves the rows
        # to the next open's first search.
        with contextlib.suppress(self._unavailable):
            self.writer.submit_later(self.index_tail, durable=False)

    def index_now(self) -> None:
        """Index every row not yet indexed, if there is one, and wait for it."""
        if self.writer is not None and self._has_tail(self.index.has_tail):
            self.writer.submit(self.index_tail, durable=False).result()


def fts_query(terms: Sequence[str]) -> str:
    """An FTS5 query in which every term must start a word: each a quoted prefix (terms are
    letters and digits only, ``search_terms``, so none can close its quotes)."""
    return " ".join(f'"{term}"*' for term in terms)
