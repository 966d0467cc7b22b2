"""JSON as ``json.loads`` returns it, for the delivery rooms and the storage that implements them,
and ``json_copy``, a deep copy of such a value.

``agent.messages`` declares the same two aliases: ``agent`` and ``delivery`` are sibling
layers that may not import each other (``[tool.importlinter]``), and the aliases are
structural, so a value typed with one fits the other. Readers narrow with isinstance.
"""

from __future__ import annotations

from typing import TypeAlias

JSONValue: TypeAlias = "str | int | float | bool | list[JSONValue] | dict[str, JSONValue] | None"
JSONObject: TypeAlias = "dict[str, JSONValue]"


def json_copy(value: JSONValue) -> JSONValue:
    """A deep copy of a JSON value: its dicts and lists copied, the rest (immutable) shared.
    ``copy.deepcopy`` does the same for any object at several times the cost (its memo and
    dispatch per value), which a re-offer of hundreds of due timers paid per event."""
    if isinstance(value, dict):
        return {k: json_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_copy(v) for v in value]
    return value
