"""Lenient readers for tool-call arguments, which models do not always type as the schema says."""

from __future__ import annotations

from typing import Any

_TRUE = {"true", "1", "yes", "on"}


def as_bool(value: Any, default: bool = False) -> bool:
    # Smaller models often send "true" as a string; reading it as the model meant it beats
    # an error round-trip.
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        return value.strip().lower() in _TRUE
    if isinstance(value, int | float):
        return value != 0
    return default


def as_optional_str(value: Any) -> str | None:
    if value is None:
        return None
    text = value if isinstance(value, str) else str(value)
    return text if text.strip() else None


def as_str_list(value: Any) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        items = [part.strip() for part in value.split(",")]
    elif isinstance(value, list | tuple):
        items = [str(part).strip() for part in value]
    else:
        return None
    return [item for item in items if item] or None


def as_number(value: object) -> float | None:
    """A number, or a string holding one ("90" as often as 90); None for anything else
    (a bool is not a number here: ``true`` seconds is a mistake, not 1)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def required_note(value: object, *, purpose: str, max_chars: int, error: type[Exception]) -> str:
    """The note a timer tool keeps for the agent's later self, stripped; ``error`` (the
    tool's own) says why when it is missing, blank or longer than ``max_chars``. ``purpose``
    tells the model what the note is for ("what to do when woken")."""
    if not isinstance(value, str) or not value.strip():
        raise error(f"note must be a non-empty string: {purpose}")
    note = value.strip()
    if len(note) > max_chars:
        raise error(f"note is {len(note)} characters; at most {max_chars}")
    return note
