"""A chat platform's own small values in the store (Matrix keeps its ``/sync`` token and its
device there), on every backend: read back by a second server, replaced, never mixed up."""

from __future__ import annotations

from collections.abc import Callable

from delivery.telegram_backend import TelegramBackend
from tests.telegram.test_state_backends import opener, store

__all__ = ["opener", "store"]  # the backends' fixtures, one store opened as two servers


def test_a_value_is_set_replaced_and_seen_by_another_server(
    opener: Callable[[], TelegramBackend],
) -> None:
    first, second = opener(), opener()
    assert first.platform_value("matrix:@bot:hs:sync") is None
    first.set_platform_value("matrix:@bot:hs:sync", "s1_2_3")
    assert second.platform_value("matrix:@bot:hs:sync") == "s1_2_3"
    second.set_platform_value("matrix:@bot:hs:sync", "s9_9_9")
    assert first.platform_value("matrix:@bot:hs:sync") == "s9_9_9"
    assert first.platform_value("matrix:@other:hs:sync") is None


def test_values_outlive_a_reopen(opener: Callable[[], TelegramBackend]) -> None:
    first = opener()
    first.set_platform_value("matrix:device", "DEV1")
    first.close()
    assert opener().platform_value("matrix:device") == "DEV1"


def test_a_passing_value_is_pruned_and_a_lasting_one_kept(
    opener: Callable[[], TelegramBackend],
) -> None:
    store = opener()
    store.set_platform_value("matrix:sync", "s1")
    store.set_platform_value("matrix:event:1", "$old", written_at=100.0)
    store.set_platform_value("matrix:event:2", "$new", written_at=300.0)
    store.prune(200.0)
    assert store.platform_value("matrix:sync") == "s1"
    assert store.platform_value("matrix:event:1") is None
    assert store.platform_value("matrix:event:2") == "$new"
