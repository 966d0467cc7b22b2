"""Ending background tasks at shutdown: give them a grace period, then cancel the rest.

Every surface keeps tasks that must not be cut off mid-write (turns, deliveries, followers
of a stream, claims being settled); each stops them the same way, here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

__all__ = ["finish_or_cancel"]


async def finish_or_cancel(tasks: Iterable[asyncio.Task[Any]], grace_seconds: float) -> None:
    """Wait up to ``grace_seconds`` for ``tasks`` to end, cancel those still running, and
    wait for the cancelled ones too, so nothing of theirs runs after this returns."""
    running = {t for t in tasks if not t.done()}
    if not running:
        return
    _, late = await asyncio.wait(running, timeout=grace_seconds)
    for task in late:
        task.cancel()
    await asyncio.gather(*late, return_exceptions=True)
