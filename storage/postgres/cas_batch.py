"""Many compare-and-sets of the same shape as one PostgreSQL statement.

``LedgerTx.update_many`` is how a re-offer pass marks the due timers it offers: hundreds of
rows, each its own compare-and-set (``storage.sql.UpdateCompiler``); the claims and
acknowledgements that follow are hundreds more in each writer batch. Sent as one statement
each, even in one pipeline, the server parses, plans and runs an ``UPDATE`` per row and the
client builds and reads a cursor per row: with ten thousand timers due in one second that
cost most of their firing lateness. ``BatchCompiler`` compiles the updates that share one
shape (the same columns, the same kinds of values: ``UpdateCompiler``'s plan key) into one
``UPDATE deliveries ... FROM`` a table of their values: each of its rows is one update,
joined to its ledger row by id, with the same expectations in the ``WHERE`` as its own
statement would carry, so each row changes exactly when its own compare-and-set would
have. ``RETURNING id`` says which did.

The values travel as one JSON array of rows, read back column by column with the column's
own type: encoding it is one C call (``orjson``'s: the standard library's encoder took half
of building a 500-row claim statement), where psycopg adapts an array element by element in
Python (which cost more than the statements saved). They are parsed as ``jsonb``, once: the
planner inlines the subquery, so every ``v->>k`` runs for each row where it is used, and on
``json`` each one parses the row's text again (measured: a third of a 500-row claim
statement's time on the server went there). A float survives the trip exactly (Python writes
the shortest text that reads back as the same double; ``jsonb`` keeps a number's digits as a
``numeric`` and prints them back unchanged; PostgreSQL reads them so), so an equality on a
stored due time still matches (``orjson`` writes the shortest such text too, its exponent
spelled ``1e16`` where Python spells it ``1e+16``: the same number). ``orjson`` would write a
NaN or an infinity as ``null``, which is another value: the rows' floats are checked first,
and a batch holding one, or anything else ``orjson`` refuses or writes in a way of its own (an
integer beyond 64 bits, a dataclass, a datetime), is written by the standard library, as
before.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import fields
from math import isfinite
from typing import Any

import orjson

from delivery.backend import JSON_COLUMNS, AtMost, Below, Increment, IsSet, Update, check_columns
from delivery.rows import FIELDS, LedgerRow
from storage.sql import Statement, dump_json

__all__ = ["SQL_TYPES", "BatchCompiler", "groups", "shape"]


def _sql_type(annotation: str) -> str:
    """The PostgreSQL type of a ``LedgerRow`` field's column, from its annotation (a
    string: ``delivery.rows`` postpones them)."""
    words = set(annotation.replace("|", " ").split())
    if "float" in words:
        return "float8"
    if "int" in words:
        return "int4"
    return "text"  # text, and the JSON columns (stored as text)


# Each column's type, from the record that fixes the storage order (migration 1 made its
# REALs DOUBLE PRECISION and its counters INTEGER; a test holds the two together).
SQL_TYPES: dict[str, str] = {f.name: _sql_type(str(f.type)) for f in fields(LedgerRow)}
assert set(SQL_TYPES) == set(FIELDS)

# How each kind of expectation reads in the WHERE, and whether it binds a number.
_PREDICATES: dict[type, tuple[str, bool]] = {
    type(None): ("IS NULL", False),
    IsSet: ("IS NOT NULL", False),
    AtMost: ("<=", True),
    Below: ("<", True),
}
_PLAIN, _INCREMENT, _JSON = 0, 1, 2
# What the standard library refuses, orjson must refuse too (see the module docstring).
_STRICT = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME

# The plan of one shape: (sql, how each change is bound, (position, a bound number) of each
# expectation that binds a value, the positions in a row of the changes that are floats)
_Plan = tuple[str, tuple[int, ...], tuple[tuple[int, bool], ...], tuple[int, ...]]


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
    """Compiles updates of one shape into one ``UPDATE ... FROM (their values) RETURNING
    id`` (see the module docstring); each shape's SQL is built once and prepared by the
    server."""

    def __init__(self) -> None:
        self._plans: dict[tuple[Any, ...], _Plan] = {}

    def statement(self, updates: list[Update]) -> Statement | None:
        """One statement for ``updates``: all of one ``shape``, each of a different row;
        None when a value has no exact JSON form (a NaN, an object JSON does not know): they
        go one statement each then."""
        key = shape(updates[0])
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._plan(updates[0])
        sql, change_kinds, bound, floats = plan
        # Each row is its changes' values as they are, then the few that need a form of
        # their own (an increment's step, a JSON column's text) put in place: a burst's
        # writer batch builds hundreds of rows, nearly all of plain values.
        special = [(at, kind) for at, kind in enumerate(change_kinds, 1) if kind != _PLAIN]
        exact = True  # every float finite (see the module docstring)
        rows: list[list[Any]] = []
        for row_id, expect, changes in updates:
            row: list[Any] = [row_id, *changes.values()]
            for at, kind in special:
                value = row[at]
                if kind == _INCREMENT:
                    row[at] = value.by
                elif value is not None:
                    row[at] = dump_json(value)
            for at in floats:
                exact = exact and isfinite(row[at])
            if bound:
                checks = list(expect.values())
                for i, number in bound:
                    value = checks[i]
                    if number:  # AtMost(0) beside AtMost(4.5): the shape names the wrapper
                        value = value.value if value.value is None else float(value.value)
                    if type(value) is float:
                        exact = exact and isfinite(value)
                    row.append(value)
            rows.append(row)
        if exact:
            try:
                return sql, [orjson.dumps(rows, option=_STRICT).decode()]
            except TypeError:  # orjson.JSONEncodeError is one
                pass
        try:
            payload = json.dumps(rows, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError):
            return None
        return sql, [payload]

    @staticmethod
    def _plan(update: Update) -> _Plan:
        _row_id, expect, changes = update
        check_columns(changes)
        check_columns(expect)
        values = ["v->>0 AS id"]
        sets: list[str] = []
        change_kinds: list[int] = []
        for i, (col, value) in enumerate(changes.items()):
            at = len(values)
            values.append(f"(v->>{at})::{SQL_TYPES[col]} AS c{i}")
            if type(value) is Increment:
                sets.append(f"{col} = d.{col} + u.c{i}")
                change_kinds.append(_INCREMENT)
            else:
                sets.append(f"{col} = u.c{i}")
                change_kinds.append(_JSON if col in JSON_COLUMNS else _PLAIN)
        where = ["d.id = u.id"]
        bound: list[tuple[int, bool]] = []
        for i, (col, value) in enumerate(expect.items()):
            predicate, number = _PREDICATES.get(type(value), ("=", False))
            if predicate in ("IS NULL", "IS NOT NULL"):
                where.append(f"d.{col} {predicate}")
                continue
            at = len(values)
            values.append(f"(v->>{at})::{'float8' if number else SQL_TYPES[col]} AS e{i}")
            where.append(f"d.{col} {predicate} u.e{i}")
            bound.append((i, number))
        sql = (
            f"UPDATE deliveries AS d SET {', '.join(sets)}"
            f" FROM (SELECT {', '.join(values)} FROM jsonb_array_elements(%s::jsonb) AS v) AS u"
            f" WHERE {' AND '.join(where)} RETURNING d.id"
        )
        floats = tuple(at for at, value in enumerate(changes.values(), 1) if type(value) is float)
        return sql, tuple(change_kinds), tuple(bound), floats


def groups(
    updates: Iterable[Update], *, positions: list[int] | None = None
) -> dict[tuple[Any, ...], list[int]]:
    """The positions of ``updates`` (their own, or those given) by ``shape``, in order."""
    found: dict[tuple[Any, ...], list[int]] = {}
    for at, update in enumerate(updates):
        found.setdefault(shape(update), []).append(at if positions is None else positions[at])
    return found
