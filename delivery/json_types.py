"""JSON as ``json.loads`` returns it, for the delivery rooms and the storage that implements them.

``agent.messages`` declares the same two aliases: ``agent`` and ``delivery`` are sibling
layers that may not import each other (``[tool.importlinter]``), and the aliases are
structural, so a value typed with one fits the other. Readers narrow with isinstance.
"""

from __future__ import annotations

from typing import TypeAlias

JSONValue: TypeAlias = "str | int | float | bool | list[JSONValue] | dict[str, JSONValue] | None"
JSONObject: TypeAlias = "dict[str, JSONValue]"
