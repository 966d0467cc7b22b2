"""Which event loop ``reveille serve`` runs on: uvloop's when it is installed (the ``fast``
extra, ``pip install 'reveille[fast]'``), asyncio's otherwise.

``REVEILLE_EVENT_LOOP`` chooses: ``auto`` (the default: uvloop when installed), ``uvloop``
(required: the start fails with a clear message when it is missing) or ``asyncio``. It is
read from the environment, not the settings file, because the loop exists before the
settings are loaded; workers inherit it from their supervisor.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping

__all__ = ["EVENT_LOOP_ENV", "EventLoopChoice", "choose_event_loop"]

EVENT_LOOP_ENV = "REVEILLE_EVENT_LOOP"
_CHOICES = ("auto", "uvloop", "asyncio")

LoopFactory = Callable[[], asyncio.AbstractEventLoop]


class EventLoopChoice:
    """The loop chosen: its name (``asyncio`` or ``uvloop``) and what makes one."""

    __slots__ = ("factory", "name")

    def __init__(self, name: str, factory: LoopFactory) -> None:
        self.name = name
        self.factory = factory


def choose_event_loop(environ: Mapping[str, str] | None = None) -> EventLoopChoice:
    """The loop ``REVEILLE_EVENT_LOOP`` asks for (see the module docstring); ``ValueError``
    for an unknown name, or for ``uvloop`` where it is not installed."""
    env = os.environ if environ is None else environ
    wanted = (env.get(EVENT_LOOP_ENV) or "auto").strip().lower()
    if wanted not in _CHOICES:
        raise ValueError(f"{EVENT_LOOP_ENV}={wanted!r} is not one of {', '.join(_CHOICES)}")
    if wanted != "asyncio":
        try:
            import uvloop
        except ImportError:
            if wanted == "uvloop":
                raise ValueError(
                    f"{EVENT_LOOP_ENV}=uvloop but uvloop is not installed "
                    "(pip install 'reveille[fast]')"
                ) from None
        else:
            return EventLoopChoice("uvloop", uvloop.new_event_loop)
    return EventLoopChoice("asyncio", asyncio.new_event_loop)
