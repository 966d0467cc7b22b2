"""``REVEILLE_EVENT_LOOP``: which loop ``reveille serve`` runs on (``reveille.event_loop``)."""

from __future__ import annotations

import asyncio

import pytest

from reveille.event_loop import choose_event_loop
from tests.event_loops import available_loops

HAS_UVLOOP = "uvloop" in available_loops()


def test_auto_takes_uvloop_when_installed_and_asyncio_otherwise() -> None:
    for env in ({}, {"REVEILLE_EVENT_LOOP": "auto"}, {"REVEILLE_EVENT_LOOP": " AUTO "}):
        assert choose_event_loop(env).name == ("uvloop" if HAS_UVLOOP else "asyncio")


def test_asyncio_is_chosen_when_asked_for() -> None:
    choice = choose_event_loop({"REVEILLE_EVENT_LOOP": "asyncio"})
    assert choice.name == "asyncio"
    loop = choice.factory()
    try:
        assert type(loop).__module__.startswith("asyncio")
    finally:
        loop.close()


@pytest.mark.skipif(not HAS_UVLOOP, reason="uvloop is not installed")
def test_uvloop_is_chosen_when_asked_for() -> None:
    choice = choose_event_loop({"REVEILLE_EVENT_LOOP": "uvloop"})
    loop = choice.factory()
    try:
        assert choice.name == "uvloop" and type(loop).__module__.startswith("uvloop")
        assert loop.run_until_complete(asyncio.sleep(0, "ran")) == "ran"
    finally:
        loop.close()


def test_an_unknown_loop_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="REVEILLE_EVENT_LOOP='trio' is not one of"):
        choose_event_loop({"REVEILLE_EVENT_LOOP": "trio"})
