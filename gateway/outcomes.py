"""What the runner reports about each completion it handled, for observers (metrics).

``GatewayRunner`` calls its ``on_outcome`` observer once per handled completion with a
``DeliveryOutcome``; the observer must not raise (what it raises is logged and ignored) and
must not block. This module imports nothing of any metrics library: the composition root
turns outcomes into whatever it exports.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from agent.messages import JSONObject
from gateway.config import Platform

__all__ = ["DeliveryOutcome", "OutcomeObserver"]


@dataclass(frozen=True)
class DeliveryOutcome:
    """``outcome``: delivered | released | retryable | dropped | held | foreign | ignored.

    ``platform``: the surface of the session it went to (None when it had none);
    ``claimed``: whether the runner claimed it (each claim counts one attempt);
    ``completed_at``: when the work finished (epoch seconds), for the delivery latency.
    """

    outcome: str
    platform: Platform | None
    claimed: bool
    completed_at: float | None
    event: JSONObject


OutcomeObserver = Callable[[DeliveryOutcome], None]
