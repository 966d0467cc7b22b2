"""Background shell processes and the completion queue every consumer drains (public face).

``process_registry.completion_queue`` is the one hand-off point between work that finished
and whoever delivers it: worker threads put events, the gateway watcher (asyncio) and other
consumers take them. ``process_registry.spawn`` runs a real subprocess in the background
whose completion is written to the ledger before it is queued.

This module is the stable import path of SPEC.md; the code lives in
``tools.completion_queue`` (the queue) and ``tools.background_processes`` (the processes).
"""

from __future__ import annotations

from tools.background_processes import (
    OUTPUT_TAIL_BYTES,
    ProcessInfo,
    ProcessRegistry,
    ProcessRequest,
    process_registry,
)
from tools.background_processes import _Running as _Running
from tools.background_processes import _Tail as _Tail
from tools.completion_queue import (
    CompletionQueue,
    EventQueue,
    WireEvent,
    shared_completion_queue,
)

__all__ = [
    "OUTPUT_TAIL_BYTES",
    "CompletionQueue",
    "EventQueue",
    "ProcessInfo",
    "ProcessRegistry",
    "ProcessRequest",
    "WireEvent",
    "process_registry",
    "shared_completion_queue",
]
