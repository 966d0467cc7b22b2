"""The garbage collector as a started server sets it (``reveille.collector``)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from reveille import collector


@pytest.fixture
def restored_collector() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycle() -> weakref.ref[_Node]:
    """Two objects that refer to each other and nothing else: the collector's to free."""
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


@pytest.mark.usefixtures("restored_collector")
def test_settle_freezes_what_lives_and_collects_the_young_generation_less_often() -> None:
    kept = [_Node() for _ in range(100)]  # alive at the end of the start
    gc.collect()
    collector.settle()
    assert gc.get_threshold() == collector.THRESHOLDS
    assert collector.THRESHOLDS[0] > 700  # less often than CPython's default
    assert gc.get_freeze_count() >= len(kept)
    frozen = {id(o) for o in gc.get_objects()}  # the generations' objects: the frozen are not
    assert not any(id(node) in frozen for node in kept)


@pytest.mark.usefixtures("restored_collector")
def test_a_cycle_made_after_the_start_is_still_collected() -> None:
    collector.settle()
    cycle = _cycle()
    assert cycle() is not None  # no reference count reaches zero in a cycle
    assert gc.collect() >= 2
    assert cycle() is None
