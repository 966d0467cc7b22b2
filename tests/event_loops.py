"""Tests that must hold on both event loops Reveille runs on: asyncio's own and uvloop's
(the ``fast`` extra). A test marked ``both_loops`` runs once on each (once only where
uvloop is not installed); every other async test runs on asyncio's loop as before.

The root ``conftest.py`` registers the marker and this module's pytest-asyncio hook."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest

LoopFactory = Callable[[], asyncio.AbstractEventLoop]


def available_loops() -> dict[str, LoopFactory]:
    """The event loops this environment can run: asyncio's, and uvloop's when installed."""
    loops: dict[str, LoopFactory] = {"asyncio": asyncio.new_event_loop}
    try:
        import uvloop
    except ImportError:
        return loops
    loops["uvloop"] = uvloop.new_event_loop
    return loops


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, LoopFactory]:
    if item.get_closest_marker("both_loops") is not None:
        return available_loops()
    return {"asyncio": asyncio.new_event_loop}
