"""Which updates the Telegram intake can take, and the record of those it skips.

An update's ``update_id`` orders the inbox and moves the ``getUpdates`` offset (the id + 1),
so it must be an integer that the inbox (SQLite's signed 64 bits) and the offset can hold.
Telegram gives positive 32-bit-ish ids; a relay or self-hosted Bot API server that is broken
or hostile may send anything. One such update used to block every later one (it could not
be stored, so the offset never moved, and the same traceback came again and again): now it
is skipped, logged once, and counted, and the offset moves past the good ones.

The same goes for what an update is made of. JSON is read with a nesting limit
(``loads_bounded``): a 100,000-deep update exhausted the parser (a 500 with a RecursionError
traceback) where Telegram's are a dozen levels deep. The ids a message names (chat, sender,
forum topic) must be integers Telegram gives (``telegram_id``); an update with anything else
is skipped with one warning, never a traceback.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections import OrderedDict
from typing import Any

from agent.messages import JSONObject

__all__ = [
    "MAX_DEPTH",
    "MAX_UPDATE_ID",
    "BadField",
    "SkippedUpdates",
    "TooDeep",
    "loads_bounded",
    "telegram_id",
    "update_id_of",
]

logger = logging.getLogger("gateway.surfaces.telegram.intake")

# The offset is the id + 1 and must still fit a signed 64-bit integer.
MAX_UPDATE_ID = 2**63 - 2
_REMEMBERED = 1024  # distinct skipped updates remembered, so each is logged once
# Bot API answers and updates nest about a dozen levels (an update, its message, a reply's
# message, an entity ...); far below the parser's recursion limit.
MAX_DEPTH = 64
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(rb"[\[\]{}]")
_INT64 = 2**63


class TooDeep(ValueError):
    """JSON nested beyond ``MAX_DEPTH``."""


class BadField(ValueError):
    """An update field no Bot API sends (its message says which); the update is skipped."""


def _too_deep(raw: bytes, limit: int) -> bool:
    """Whether ``raw`` opens more than ``limit`` arrays/objects at once: counted over the
    text with its strings blanked out, without parsing (so without recursion)."""
    depth = 0
    for match in _BRACKET.finditer(_STRING.sub(b'""', raw)):
        if match.group() in (b"[", b"{"):
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def loads_bounded(raw: bytes | str, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads`` that refuses (``TooDeep``) JSON nested beyond ``max_depth``; other bad
    JSON raises ``ValueError`` as ``json.loads`` does."""
    data = raw.encode("utf-8", "surrogateescape") if isinstance(raw, str) else raw
    if _too_deep(data, max_depth):
        raise TooDeep(f"JSON nested deeper than {max_depth} levels")
    try:
        return json.loads(data)
    except RecursionError:  # the count above makes this unreachable; never a traceback
        raise TooDeep(f"JSON nested deeper than {max_depth} levels") from None


def telegram_id(value: object, name: str, *, required: bool = False) -> int | None:
    """An id Telegram gives (chat, user, forum topic): an int, not a bool, within signed 64
    bits; None when absent and not ``required``; ``BadField`` for anything else."""
    if value is None and not required:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and -_INT64 < value < _INT64:
        return value
    raise BadField(f"its {name} {str(value)[:40]!r} is not an integer id")


def update_id_of(update: object) -> int | None:
    """The update's id when the intake can take it: an int (not a bool) in
    ``0..MAX_UPDATE_ID``; None for anything else (not a dict, no id, a string, a float ...)."""
    if not isinstance(update, dict):
        return None
    value = update.get("update_id")
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    return value if 0 <= value <= MAX_UPDATE_ID else None


def _fingerprint(update: object) -> str:
    if isinstance(update, bytes):
        return hashlib.sha256(update).hexdigest()
    try:
        text = json.dumps(update, sort_keys=True, default=repr)
    except (TypeError, ValueError):
        text = repr(update)
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()


def _describe(update: object) -> str:
    if isinstance(update, bytes):
        return f"an update nested deeper than {MAX_DEPTH} levels"
    if not isinstance(update, dict):
        return f"an update that is a {type(update).__name__}, not an object"
    if "update_id" not in update:
        return "an update without update_id"
    return f"an update whose update_id {str(update['update_id'])[:40]!r} is not 0..2**63-2"


class SkippedUpdates:
    """Skipped updates: each distinct one logged (a warning, no traceback) and counted
    once, however often a server sends it again."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.count = 0
        self._seen: OrderedDict[str, None] = OrderedDict()

    def record(self, update: object) -> bool:
        """Record a skipped update (the raw bytes of one that could not be parsed); False
        when it was recorded already."""
        key = _fingerprint(update)
        if key in self._seen:
            self._seen.move_to_end(key)
            return False
        self._seen[key] = None
        if len(self._seen) > _REMEMBERED:
            self._seen.popitem(last=False)
        self.count += 1
        logger.warning(
            "Telegram %s: skipped %s (%d skipped so far); the Bot API server sent what "
            "Telegram never sends",
            self.source,
            _describe(update),
            self.count,
        )
        return True


def split_updates(updates: list[Any], skipped: SkippedUpdates) -> list[tuple[int, JSONObject]]:
    """The updates the intake can take, with their ids; the others are recorded skipped."""
    good: list[tuple[int, JSONObject]] = []
    for update in updates:
        update_id = update_id_of(update)
        if update_id is None:
            skipped.record(update)
        else:
            good.append((update_id, update))
    return good
