"""Which updates the Telegram intake can take, and the record of those it skips.

An update's ``update_id`` orders the inbox and moves the ``getUpdates`` offset (the id + 1),
so it must be an integer that the inbox (SQLite's signed 64 bits) and the offset can hold.
Telegram gives positive 32-bit-ish ids; a relay or self-hosted Bot API server that is broken
or hostile may send anything. One such update used to block every later one (it could not
be stored, so the offset never moved, and the same traceback came again and again): now it
is skipped, logged once, and counted, and the offset moves past the good ones.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import OrderedDict
from typing import Any

__all__ = ["MAX_UPDATE_ID", "SkippedUpdates", "update_id_of"]

logger = logging.getLogger("gateway.platforms.telegram_intake")

# The offset is the id + 1 and must still fit a signed 64-bit integer.
MAX_UPDATE_ID = 2**63 - 2
_REMEMBERED = 1024  # distinct skipped updates remembered, so each is logged once


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
    try:
        text = json.dumps(update, sort_keys=True, default=repr)
    except (TypeError, ValueError):
        text = repr(update)
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()


def _describe(update: object) -> str:
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
        """Record a skipped update; False when it was recorded already."""
        key = _fingerprint(update)
        if key in self._seen:
            self._seen.move_to_end(key)
            return False
        self._seen[key] = None
        if len(self._seen) > _REMEMBERED:
            self._seen.popitem(last=False)
        self.count += 1
        logger.warning(
            "Telegram %s: skipped %s (%d skipped so far); the Bot API server sent an id "
            "Telegram never gives",
            self.source,
            _describe(update),
            self.count,
        )
        return True


def split_updates(updates: list[Any], skipped: SkippedUpdates) -> list[tuple[int, dict[str, Any]]]:
    """The updates the intake can take, with their ids; the others are recorded skipped."""
    good: list[tuple[int, dict[str, Any]]] = []
    for update in updates:
        update_id = update_id_of(update)
        if update_id is None:
            skipped.record(update)
        else:
            good.append((update_id, update))
    return good
