"""The web UI's side of the delivery contract: claim, acknowledge, release.

Every call resolves ``tools.async_delegation`` when it runs, not when this module is
imported, so that whichever core stands behind that name (this tree's ledger, an
embedder's, an older one) is the one that is asked. An older core whose
``release_event_delivery(evt, claim)`` has no ``retryable`` keyword gets a plain release:
the refund is lost, the release is not, and nothing raises.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

logger = logging.getLogger(__name__)

CORE_MODULE = "tools.async_delegation"


def _core() -> ModuleType:
    return importlib.import_module(CORE_MODULE)


def _release_accepts_retryable(release: Callable[..., Any]) -> bool:
    """True when ``release`` takes a ``retryable`` keyword (named, or through ``**kwargs``)."""
    try:
        params = inspect.signature(release).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        p.kind is inspect.Parameter.VAR_KEYWORD
        or (p.name == "retryable" and p.kind is not inspect.Parameter.POSITIONAL_ONLY)
        for p in params
    )


def claim_async_delegation_delivery(evt: Mapping[str, Any], consumer: str) -> str | None:
    """A claim on ``evt``'s delivery, or None when another consumer holds it or it is settled."""
    try:
        claim = _core().claim_event_delivery(evt, consumer)
    except Exception:
        logger.exception("could not claim %s", evt.get("delegation_id"))
        return None
    return claim if isinstance(claim, str) else None


def complete_async_delegation_delivery(evt: Mapping[str, Any], claim: str) -> bool:
    """Acknowledge: the wake-up turn was accepted. False when the claim had lapsed."""
    result = _core().complete_event_delivery(evt, claim)
    return result is not False


def release_async_delegation_delivery(
    evt: Mapping[str, Any], claim: str, *, retryable: bool
) -> None:
    """Give the claim back; ``retryable`` refunds the attempt where the core can."""
    release = _core().release_event_delivery
    if _release_accepts_retryable(release):
        release(evt, claim, retryable=retryable)
    else:
        release(evt, claim)
