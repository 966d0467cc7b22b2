"""The web UI's delivery consumer: completion events become wake-up turns in their session;
and the strip's ✕ (``cancel_unit``), which stops a unit of a web UI session.

For each completion of work started from the web UI:

1. Route: ``origin_ui_session_id`` is final; else the session ``PROCESS_SESSION_INDEX``
   recorded when the work started. Nothing else (never "the session open now").
2. A busy session (a running turn, a pending confirmation) is a wait, not an attempt: it is
   checked BEFORE claiming, and the wake-up is parked in ``DEFERRED_PROCESS_WAKEUPS`` with
   its ledger row still pending (a restart re-offers it).
3. Claim through the contract (``api.process_event_utils``), start the wake-up turn
   (``api.routes.start_session_turn``, looked up when called), and acknowledge only once
   the turn was accepted.
4. A refusal releases the claim. Transient ones refund the attempt (``retryable=True``): a
   stale agent runtime or a 503 that says ``retryable``, a paused wake-up, a session busy
   with another stream. Everything else, no answer at all included, is an ordinary release
   that spends one attempt of the bounded budget.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import tools.async_delegation as ad
from agent.messages import JSONObject
from api import config as cfg
from api import process_event_utils as peu
from api.turn_answers import TurnRefused
from delivery.cancel import NOT_FOUND, CancelOutcome

logger = logging.getLogger(__name__)

ASYNC_DELIVERY_ROUTING_RETRY_SECONDS = 10.0
"""How long after a release this consumer asks a core that has no re-offer scheduler of
its own (no ``runtime_is_open``) to offer its pending rows again. This tree's ledger
re-offers released rows itself when their backoff ends, so no timer is armed for it."""

CONSUMER = "webui-background"

_settle_listeners: list[Callable[[str], None]] = []


def add_settle_listener(listener: Callable[[str], None]) -> None:
    """``listener(delivery_id)`` is called (on the wake-up's thread) once its claim was
    settled: acknowledged or released. The web UI announces the ledger row's change."""
    _settle_listeners.append(listener)


def remove_settle_listener(listener: Callable[[str], None]) -> None:
    if listener in _settle_listeners:
        _settle_listeners.remove(listener)


def _settled(delivery_id: str) -> None:
    for listener in list(_settle_listeners):
        try:
            listener(delivery_id)
        except Exception:
            logger.exception("settle listener failed for %s", delivery_id)


@dataclass(frozen=True)
class Verdict:
    """What an answer of ``start_session_turn`` means for the claim."""

    accepted: bool
    retryable: bool = False
    busy: bool = False
    reason: str = ""


def classify_turn_answer(answer: Any) -> Verdict:
    """Accepted, a transient refusal (refund) or a hard one (spend an attempt): the rule of
    ``api.turn_answers.TurnRefused.refund``, read from the dict answer."""
    if not isinstance(answer, dict):
        return Verdict(accepted=False, reason="no answer from the web UI")
    if answer.get("_status") is None and answer.get("stream_id"):
        return Verdict(accepted=True)
    refused = TurnRefused.from_dict(answer)
    status = answer.get("_status")
    error = str(answer.get("error") or "")
    reason = f"{status}: {error}" if status is not None else error or "refused"
    return Verdict(accepted=False, retryable=refused.refund, busy=refused.busy, reason=reason)


def route_session(evt: Mapping[str, Any]) -> str | None:
    """The web UI session a completion belongs to, or None when it is not the web UI's."""
    origin = evt.get("origin_ui_session_id")
    if isinstance(origin, str) and origin:
        return origin
    for field in ("delegation_id", "process_id", "delivery_id"):
        found = evt.get(field)
        if isinstance(found, str) and found:
            with cfg.MAPS_LOCK:
                session_id = cfg.PROCESS_SESSION_INDEX.get(found)
            if session_id:
                return session_id
    return None


def work_id(evt: Mapping[str, Any]) -> str:
    """The ledger id a completion is delivered by (its delegation's, else its delivery's)."""
    for field in ("delegation_id", "delivery_id", "process_id"):
        value = evt.get(field)
        if isinstance(value, str) and value:
            return value
    return ""


BY_WEBUI = "the web UI"
"""How the conversation's notice names a cancel made from the strip."""


def cancel_unit(unit_id: str) -> CancelOutcome | None:
    """Stop ``unit_id`` when it is the work of a web UI session (the ledger settles it
    ``cancelled``; the server that runs it stops it); None for an unknown id or another
    surface's unit. Blocking: run it off the event loop."""
    runtime = ad.get_runtime()
    try:
        row = runtime.ledger.get(unit_id)
    except (TypeError, ValueError):
        return None
    if row is None or not row.origin_ui_session_id:
        return None
    outcome = runtime.cancel(unit_id, by=BY_WEBUI)
    return None if outcome.status == NOT_FOUND else outcome


def defer(session_id: str, evt: JSONObject) -> None:
    """Park a wake-up until its session is free; its ledger row stays pending (unclaimed)."""
    with cfg.MAPS_LOCK:
        cfg.DEFERRED_PROCESS_WAKEUPS.setdefault(session_id, {})[work_id(evt)] = evt


def _routes() -> Any:
    return importlib.import_module("api.routes")


def handle_completion(
    evt: JSONObject, text: str, *, process_registry: Any, consumer: str = CONSUMER
) -> str:
    """Route, check busy, claim and start the wake-up; returns what happened."""
    session_id = route_session(evt)
    if session_id is None:
        return "foreign"
    if _routes().session_is_busy(session_id):
        defer(session_id, evt)  # no claim taken, so no attempt spent
        return "deferred"
    claim = peu.claim_async_delegation_delivery(evt, consumer)
    if claim is None:
        return "held"
    _start_async_delegation_wakeup_turn(
        session_id,
        text,
        delegation_id=work_id(evt),
        evt=evt,
        claim=claim,
        process_registry=process_registry,
    )
    return "started"


def _start_async_delegation_wakeup_turn(
    session_id: str,
    text: str,
    *,
    delegation_id: str,
    evt: JSONObject,
    claim: str,
    process_registry: Any,
) -> threading.Thread:
    """Start the wake-up turn on a thread of its own and settle the claim by its answer."""
    thread = threading.Thread(
        target=_run_wakeup,
        args=(session_id, text, delegation_id, evt, claim, process_registry),
        name=f"wakeup-{delegation_id}",
        daemon=True,
    )
    thread.start()
    return thread


def _run_wakeup(
    session_id: str,
    text: str,
    delegation_id: str,
    evt: JSONObject,
    claim: str,
    process_registry: Any,
) -> None:
    try:
        answer = _routes().start_session_turn(session_id, text, source="process_wakeup")
    except Exception:
        logger.exception("wake-up turn for %s raised", delegation_id)
        answer = None
    verdict = classify_turn_answer(answer)
    try:
        if verdict.accepted:
            cfg.remember(delegation_id, time.time())
            if not peu.complete_async_delegation_delivery(evt, claim):
                logger.warning("wake-up %s ran but its claim had lapsed", delegation_id)
            _settled(delegation_id)
            return
        logger.info("wake-up %s refused (%s)", delegation_id, verdict.reason)
        if verdict.busy:
            defer(session_id, evt)
        peu.release_async_delegation_delivery(evt, claim, retryable=verdict.retryable)
        _settled(delegation_id)
    except Exception:
        # The claim lapses by itself and the row is offered again: nothing is lost.
        logger.exception("could not settle the claim on %s", delegation_id)
        return
    _arm_reoffer(process_registry)


def _arm_reoffer(process_registry: Any) -> None:
    core = importlib.import_module(peu.CORE_MODULE)
    if hasattr(core, "runtime_is_open"):
        return  # this tree's ledger re-offers released rows when their backoff ends
    restore = getattr(core, "restore_undelivered_completions", None)
    queue = getattr(process_registry, "completion_queue", None)
    if restore is None or queue is None:
        return
    timer = threading.Timer(ASYNC_DELIVERY_ROUTING_RETRY_SECONDS, _reoffer, (restore, queue))
    timer.daemon = True
    timer.start()


def _reoffer(restore: Any, queue: Any) -> None:
    try:
        restore(queue)
    except Exception:
        logger.exception("could not re-offer pending completions")
