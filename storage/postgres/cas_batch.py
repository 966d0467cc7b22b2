"""Many compare-and-sets of the same shape as one PostgreSQL statement.

``LedgerTx.update_many`` is how a re-offer pass marks the due timers it offers: hundreds of
rows, each its own compare-and-set (``storage.sql.UpdateCompiler``). Sent as one statement
each, even in one pipeline, the server parses, plans and runs an ``UPDATE`` per row and the
client builds and reads a cursor per row: with ten thousand timers due in one second that
cost most of their firing lateness. ``BatchCompiler`` compiles the updates that share one
shape (the same columns, the same kinds of values: ``UpdateCompiler``'s plan key) into one
``UPDATE deliveries ... FROM unnest(arrays)``: each row of the arrays is one update, joined
to its row by id, with the same expectations in the ``WHERE`` as its own statement would
carry, so each row changes exactly when its own compare-and-set would have. ``RETURNING id``
says which did.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields
from typing import Any

from delivery.backend import JSON_COLUMNS, AtMost, Below, Increment, IsSet, Update, check_columns
from delivery.rows import FIELDS, LedgerRow
from storage.sql import Statement, dump_json

__all__ = ["ARRAY_TYPES", "BatchCompiler"]


def _array_type(annotation: str) -> str:
    """The PostgreSQL array type of a ``LedgerRow`` field's values, from its annotation
    (a string: ``delivery.rows`` postpones them)."""
    words = set(annotation.replace("|", " ").split())
    if "float" in words:
        return "float8[]"
    if "int" in words:
        return "int4[]"
    return "text[]"  # text, and the JSON columns (stored as text)


# Each column's array type, from the record that fixes the storage order (migration 1 made
# its REALs DOUBLE PRECISION and its counters INTEGER; a test holds the two together).
ARRAY_TYPES: dict[str, str] = {f.name: _array_type(str(f.type)) for f in fields(LedgerRow)}
assert set(ARRAY_TYPES) == set(FIELDS)

# How each kind of expectation reads in the WHERE; None: it binds no value.
_PREDICATES: dict[type, tuple[str, bool]] = {
    type(None): ("IS NULL", False),
    IsSet: ("IS NOT NULL", False),
    AtMost: ("<=", True),
    Below: ("<", True),
}

# The plan of one shape: (sql, per change (column, json, increment), per expect (column, unwrap)
# of the values it binds)
_Plan = tuple[str, tuple[tuple[bool, bool], ...], tuple[tuple[int, bool], ...]]


def shape(update: Update) -> tuple[Any, ...]:
    """The key of the updates one statement can carry: ``UpdateCompiler``'s plan key."""
    _row_id, expect, changes = update
    return (
        tuple(changes),
        tuple(map(type, changes.values())),
        tuple(expect),
        tuple(map(type, expect.values())),
    )


class BatchCompiler:
    """Compiles updates of one shape into one ``UPDATE ... FROM unnest(...) RETURNING id``
    (see the module docstring); each shape's SQL is built once and prepared by the server."""

    def __init__(self) -> None:
        self._plans: dict[tuple[Any, ...], _Plan] = {}

    def statement(self, updates: list[Update]) -> Statement:
        """One statement for ``updates``: all of one ``shape``, each of a different row."""
        key = shape(updates[0])
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._plan(updates[0])
        sql, change_kinds, bound = plan
        changed = [list(changes.values()) for _r, _e, changes in updates]
        checked = [list(expect.values()) for _r, expect, _c in updates]
        columns: list[list[Any]] = [[row_id for row_id, _e, _c in updates]]
        for i, (is_json, is_increment) in enumerate(change_kinds):
            values = [one[i] for one in changed]
            if is_increment:
                values = [v.by for v in values]
            elif is_json:
                values = [None if v is None else dump_json(v) for v in values]
            columns.append(values)
        for i, unwrap in bound:
            columns.append([one[i].value if unwrap else one[i] for one in checked])
        return sql, columns

    @staticmethod
    def _plan(update: Update) -> _Plan:
        _row_id, expect, changes = update
        check_columns(changes)
        check_columns(expect)
        arrays, names = ["%s::text[]"], ["id"]
        sets: list[str] = []
        change_kinds: list[tuple[bool, bool]] = []
        for i, (col, value) in enumerate(changes.items()):
            increment = type(value) is Increment
            arrays.append(f"%s::{ARRAY_TYPES[col]}")
            names.append(f"c{i}")
            sets.append(f"{col} = d.{col} + v.c{i}" if increment else f"{col} = v.c{i}")
            change_kinds.append((col in JSON_COLUMNS and not increment, increment))
        where = ["d.id = v.id"]
        bound: list[tuple[int, bool]] = []
        for i, (col, value) in enumerate(expect.items()):
            predicate, unwrap = _PREDICATES.get(type(value), ("=", False))
            if predicate in ("IS NULL", "IS NOT NULL"):
                where.append(f"d.{col} {predicate}")
                continue
            arrays.append(f"%s::{ARRAY_TYPES[col]}")
            names.append(f"e{i}")
            where.append(f"d.{col} {predicate} v.e{i}")
            bound.append((i, unwrap))
        sql = (
            f"UPDATE deliveries AS d SET {', '.join(sets)}"
            f" FROM unnest({', '.join(arrays)}) AS v({', '.join(names)})"
            f" WHERE {' AND '.join(where)} RETURNING d.id"
        )
        return sql, tuple(change_kinds), tuple(bound)


def groups(updates: Iterable[Update]) -> dict[tuple[Any, ...], list[int]]:
    """The positions of ``updates`` by ``shape``, in order."""
    found: dict[tuple[Any, ...], list[int]] = {}
    for at, update in enumerate(updates):
        found.setdefault(shape(update), []).append(at)
    return found
