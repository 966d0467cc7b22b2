"""SQL shared by the SQL dialects (SQLite, PostgreSQL): written once, parameterized by the
placeholder mark (``?`` or ``%s``).

The placeholder, one way, for every shared SQL module of ``storage/``: the SQL is written
with ``?``; a module gets the dialect's placeholder (``storage.<dialect>.dialect.PLACEHOLDER``,
``Dialect.placeholder``) as ``mark``, the first argument of its constructor or function,
and binds each statement with ``marked(sql, mark)``.

- ``UpdateCompiler``: the compare-and-set ``UPDATE`` of ``LedgerTx.update``; its statement
  depends only on the columns and the value types, so it is compiled once per shape and the
  hot path only binds values.
- ``query_filter``: the ``WHERE`` clause of the operators' ledger queries (a ``RowQuery``);
  a dialect says how its text index matches a goal's words (``GoalSearch``).
- ``marked``: SQL written with ``?`` in a dialect's placeholder.
- ``dump_json`` / ``decode_row`` / ``decode_columns``: a stored row's JSON columns, both
  ways; a whole row becomes a ``LedgerRow``, a few columns (inside an operation) a dict.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from delivery.backend import (
    COLUMNS,
    JSON_COLUMNS,
    AtMost,
    Below,
    Increment,
    IsSet,
    check_columns,
)
from delivery.rows import LedgerRow, PendingCounts, RowQuery

__all__ = [
    "PENDING_COUNTS",
    "WAITING_HELD_BY",
    "GoalSearch",
    "Statement",
    "UpdateCompiler",
    "decode_columns",
    "decode_row",
    "dump_json",
    "pending_counts",
    "query_filter",
]

Statement = tuple[str, list[Any]]

# (sql, indexes of JSON values, indexes of Increment values, (expect index, unwrap) to bind)
_Plan = tuple[str, tuple[int, ...], tuple[int, ...], tuple[tuple[int, bool], ...]]


def dump_json(value: Any) -> str:
    """The stored text of a JSON column (``request``, ``event``), in every SQL backend."""
    return json.dumps(value, separators=(",", ":"), default=str)


# The positions of the JSON columns in a whole row: decoding binds them, never looks them up.
_REQUEST, _EVENT = COLUMNS.index("request"), COLUMNS.index("event")
_PROGRESS = COLUMNS.index("progress")
assert {"request", "event", "progress"} == JSON_COLUMNS, "decode_row knows these JSON columns"


def decode_row(row: Iterable[Any]) -> LedgerRow:
    """A stored row (every column, in storage order) as a ``LedgerRow``: decoded once, here,
    for every reader of the SQL dialects."""
    values = list(row)
    for at in (_REQUEST, _EVENT, _PROGRESS):
        if values[at] is not None:
            values[at] = json.loads(values[at])
    return LedgerRow(*values)


def decode_columns(row: Iterable[Any], columns: tuple[str, ...]) -> dict[str, Any]:
    """A few stored ``columns`` of a row, in order, as the dict ``LedgerTx.get`` returns."""
    out = dict(zip(columns, row, strict=True))
    for col in JSON_COLUMNS:
        text = out.get(col)
        if text is not None:
            out[col] = json.loads(text)
    return out


def marked(sql: str, mark: str) -> str:
    """``sql``, written with ``?``, with each ``?`` in the placeholder ``mark`` (``?``,
    ``%s``, or a named ``%(name)s``). Shared SQL holds no other ``?``."""
    return sql if mark == "?" else sql.replace("?", mark)


class UpdateCompiler:
    """Compiles ``LedgerTx.update(row_id, expect, changes)`` into one ``UPDATE deliveries``
    whose ``WHERE`` carries every expectation, so the store applies it only where they all
    still hold (the compare-and-set every ledger transition is)."""

    def __init__(self, mark: str) -> None:
        self._mark = mark
        # SQL of the predicates ``expect`` accepts (equality otherwise)
        self._predicates: dict[type, str] = {
            type(None): "IS NULL",
            AtMost: "<= ?",
            Below: "< ?",
            IsSet: "IS NOT NULL",
        }
        self._plans: dict[tuple[Any, ...], _Plan] = {}

    def statement(self, row_id: str, expect: dict[str, Any], changes: dict[str, Any]) -> Statement:
        values = list(changes.values())
        checks = tuple(expect.values())
        key = (tuple(changes), tuple(map(type, values)), tuple(expect), tuple(map(type, checks)))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._plan(changes, expect)
        sql, json_at, increment_at, bind_checks = plan
        for i in json_at:
            values[i] = dump_json(values[i])
        for i in increment_at:
            values[i] = values[i].by
        values.append(row_id)
        for i, unwrap in bind_checks:
            values.append(checks[i].value if unwrap else checks[i])
        return sql, values

    def _plan(self, changes: dict[str, Any], expect: dict[str, Any]) -> _Plan:
        check_columns(changes)
        check_columns(expect)
        sets, json_at, increment_at = [], [], []
        for i, (col, value) in enumerate(changes.items()):
            if type(value) is Increment:
                sets.append(f"{col} = {col} + ?")
                increment_at.append(i)
            else:
                sets.append(f"{col} = ?")
                if col in JSON_COLUMNS and value is not None:
                    json_at.append(i)
        sql = f"UPDATE deliveries SET {', '.join(sets)} WHERE id = ?"
        bind: list[tuple[int, bool]] = []
        for i, (col, value) in enumerate(expect.items()):
            kind = type(value)
            sql += f" AND {col} {self._predicates.get(kind, '= ?')}"
            if kind is AtMost or kind is Below:
                bind.append((i, True))
            elif value is not None and kind is not IsSet:
                bind.append((i, False))
        return marked(sql, self._mark), tuple(json_at), tuple(increment_at), tuple(bind)


@dataclass(frozen=True, slots=True)
class GoalSearch:
    """How a dialect finds the rows whose goal holds words, through its text index:
    ``condition`` is SQL with one placeholder, bound to ``query(terms)`` (the words,
    ``RowQuery.terms``, as that index's query text: each a prefix, all required)."""

    condition: str
    query: Callable[[Sequence[str]], str]


def query_filter(mark: str, query: RowQuery, search: GoalSearch) -> tuple[str, list[Any]]:
    """The ``WHERE`` clause (empty when nothing filters) and its parameters of a
    ``LedgerViews.query`` in SQL whose placeholder is ``mark`` (``?`` or ``%s``); a session
    matches its routing key and either origin id; text matches by the dialect's ``search``."""
    where: list[str] = []
    params: list[Any] = []
    filters = (
        ("state", query.state),
        ("delivery_state", query.delivery_state),
        ("kind", query.kind),
        ("hook", query.hook),
    )
    for col, value in filters:
        if value is not None:
            where.append(marked(f"{col} = ?", mark))
            params.append(value)
    if query.session is not None:
        where.append(
            marked("(session_key = ? OR origin_session_id = ? OR origin_ui_session_id = ?)", mark)
        )
        params.extend([query.session] * 3)
    terms = query.terms
    if terms is not None:
        if terms:
            where.append(search.condition)
            params.append(search.query(terms))
        else:
            where.append("1 = 0")  # text without a word matches no row
    return (" WHERE " + " AND ".join(where) if where else ""), params


# The rows ``LedgerTx.adopt_waiting`` takes over: pending, held by the (dead) holder bound
# first, their result in, their next attempt after the instant bound second. Spelled so
# that both dialects find them through the pending holders' index.
WAITING_HELD_BY = (
    "delivery_state = 'pending' AND holder = ? AND completed_at IS NOT NULL AND next_attempt_at > ?"
)


# -- retention: what a settled row is, for both dialects ------------------------------------

# Work that ended, a delivery that settled before the cutoff, and no claim that could still
# be live then: the only rows retention may delete. Every delete repeats it in its WHERE, so
# a row redelivered (dropped -> pending) after it was picked is left alone. Spelled like the
# partial index's WHERE, so that SQLite uses that index.
SETTLED = (
    "delivery_state IN ('delivered', 'dropped') AND state NOT IN ('queued', 'running')"
    " AND settled_at < ? AND claim_expires_at < ?"
)
SETTLED_COLUMNS = "id, kind, settled_at, origin_session_id"
TOMBSTONE_COLUMNS = (
    "id, kind, state, delivery_state, session_key, completed_at, settled_at, pruned_at, reason"
)


def settled_page(mark: str) -> str:
    """One keyset page of prunable rows: params before, before, after_at, after_id, limit."""
    return marked(
        f"SELECT {SETTLED_COLUMNS} FROM deliveries WHERE {SETTLED}"
        " AND (settled_at, id) > (?, ?) ORDER BY settled_at, id LIMIT ?",
        mark,
    )


# ``LedgerViews.pending_counts``: pending rows by lifecycle state, and those not due yet.
PENDING_COUNTS = (
    "SELECT state, COUNT(*), SUM(CASE WHEN next_attempt_at > ? THEN 1 ELSE 0 END) "
    "FROM deliveries WHERE delivery_state = 'pending' GROUP BY state"
)


def pending_counts(rows: Iterable[Iterable[Any]]) -> PendingCounts:
    """``PendingCounts`` from the rows of ``PENDING_COUNTS``."""
    by_state: dict[str, int] = {}
    later = 0
    for state, count, not_due in rows:
        by_state[str(state)] = int(count or 0)
        later += int(not_due or 0)
    return PendingCounts(by_state, later)
