"""Traces: the spans of turns, background units and deliveries, and the link between them.

Only ``opentelemetry-api`` is used here, so every span is a no-op (and nothing is carried)
until the composition root configures an SDK (``reveille.tracing``, when an OTLP endpoint
is set). Background work outlives the turn that started it and its result comes back as a
separate delivery, often minutes later and possibly on another server; the one thread that
ties them together is the W3C ``traceparent`` of the dispatching turn's span, which the
dispatch stores with the work's request (and so in its completion event, the ledger row
and every re-offer): the unit's span is that turn's child, and the delivery's span LINKS to
it. The wake-up turn a delivery starts is the delivery's child (in this process's context,
or through the ``traceparent`` header of the API server's self-POST).

Attributes are identifiers and outcomes only (session, delivery id, tool name, outcome):
never message text, goals, commands or secrets.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Awaitable, Coroutine, Iterator, Mapping
from typing import Any, TypeVar

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

__all__ = [
    "TRACEPARENT",
    "carry_current",
    "delivery_span",
    "links_to",
    "note_outcome",
    "record_background",
    "traced_turn",
    "tracer",
    "turn_traceparent",
    "turn_work",
]

TRACEPARENT = "traceparent"
"""The key of a completion event (and of a dispatch's stored request) holding the W3C
traceparent of the turn that started the work; absent when tracing is off."""

T = TypeVar("T")

_PROPAGATOR = TraceContextTextMapPropagator()
# The traceparent of the turn running in this context: a tool that dispatches background
# work runs inside the turn (and on threads that copy its context), and stores it.
_turn: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "reveille_turn_traceparent", default=None
)


_cached: tuple[trace.TracerProvider, trace.Tracer] | None = None


def tracer() -> trace.Tracer:
    """Reveille's tracer from the provider in place now: kept per provider, never across a
    change (a tracer taken before the SDK was configured would stay a no-op for good)."""
    global _cached
    provider = trace.get_tracer_provider()
    cached = _cached
    if cached is not None and cached[0] is provider:
        return cached[1]
    if isinstance(provider, trace.ProxyTracerProvider):
        found: trace.Tracer = trace.NoOpTracer()  # no SDK (yet): a proxy would stick to it
    else:
        found = provider.get_tracer("reveille")
    _cached = (provider, found)
    return found


def _traceparent_of(span: Span) -> str | None:
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get(TRACEPARENT)


def _context_of(traceparent: Any) -> Context | None:
    if not isinstance(traceparent, str) or not traceparent:
        return None
    return _PROPAGATOR.extract({TRACEPARENT: traceparent})


def carry_current(headers: dict[str, str]) -> None:
    """Add the current span's traceparent to ``headers`` of a request this server sends
    itself (a wake-up's self-POST), so the turn it starts is the delivery's child."""
    _PROPAGATOR.inject(headers)


def turn_traceparent() -> str | None:
    """The traceparent of the turn running here, or None (no turn, or tracing off)."""
    return _turn.get()


def links_to(traceparent: Any) -> list[Link]:
    """A link to the span a stored traceparent names; none when it is absent or malformed."""
    context = _context_of(traceparent)
    if context is None:
        return []
    span_context = trace.get_current_span(context).get_span_context()
    return [Link(span_context)] if span_context.is_valid else []


def note_outcome(outcome: str) -> None:
    """Put ``outcome`` on the current span (a failure-like one also marks it an error)."""
    span = trace.get_current_span()
    span.set_attribute("reveille.outcome", outcome)
    if outcome in _FAILURES:
        span.set_status(StatusCode.ERROR)


_FAILURES = frozenset({"error", "failed", "unknown", "interrupted", "released", "dropped"})


def turn_work(
    work: Coroutine[Any, Any, T],
    *,
    session_id: str,
    platform: str,
    wakeup: bool,
    parent: str | None = None,
) -> Coroutine[Any, Any, T]:
    """What a turn's task runs: ``work`` inside the turn's span (``traced_turn``), or, while
    tracing is off (no SDK: every turn of most servers), ``work`` itself, without a
    coroutine around it that every step of the turn would pass through."""
    if isinstance(tracer(), trace.NoOpTracer):
        return work
    return traced_turn(work, session_id=session_id, platform=platform, wakeup=wakeup, parent=parent)


async def traced_turn(
    work: Awaitable[T],
    *,
    session_id: str,
    platform: str,
    wakeup: bool,
    parent: str | None = None,
) -> T:
    """Await ``work`` (a turn's coroutine, not started yet) inside the turn's span, with its
    traceparent current for the background work it dispatches. ``parent`` (a traceparent)
    makes the span the child of that one instead of the current span's."""
    turn_tracer = tracer()
    if isinstance(turn_tracer, trace.NoOpTracer):
        # Tracing off (no SDK): no span and nothing to carry; every turn takes this path.
        return await work
    attributes: dict[str, AttributeValue] = {
        "reveille.session_id": session_id,
        "reveille.platform": platform,
        "reveille.wakeup": wakeup,
    }
    # Exceptions are not recorded on spans: their messages may quote what was said.
    with turn_tracer.start_as_current_span(
        "reveille.turn",
        context=_context_of(parent),
        attributes=attributes,
        record_exception=False,
    ) as span:
        token = _turn.set(_traceparent_of(span))
        try:
            result = await work
        except BaseException as exc:
            span.set_attribute("reveille.outcome", getattr(exc, "kind", type(exc).__name__))
            raise
        finally:
            _turn.reset(token)
        span.set_attribute("reveille.outcome", "stored")
        return result


def record_background(
    kind: str, delivery_id: str, request: Mapping[str, Any], started: float, outcome: str
) -> None:
    """The span of a background unit that ran from ``started`` (epoch seconds) until now: a
    child of the turn that dispatched it. Recorded at its end, since the unit runs on
    threads (and an adopted process even began under another server)."""
    span = tracer().start_span(
        f"reveille.background.{kind}",
        context=_context_of(request.get(TRACEPARENT)),
        start_time=int(started * 1e9),
        attributes={
            "reveille.delivery_id": delivery_id,
            "reveille.session_id": _session_of(request),
            "reveille.outcome": outcome,
        },
    )
    if outcome in _FAILURES:
        span.set_status(StatusCode.ERROR)
    span.end()


@contextlib.contextmanager
def delivery_span(evt: Any) -> Iterator[Span]:
    """The span of one delivery of a completion, linked to the turn that started the work;
    a root of its own (the delivery happens long after, maybe on another server)."""
    event: Mapping[str, Any] = evt if isinstance(evt, Mapping) else {}
    delivery = event.get("delegation_id") or event.get("delivery_id") or event.get("process_id")
    with tracer().start_as_current_span(
        "reveille.delivery",
        context=Context(),
        links=links_to(event.get(TRACEPARENT)),
        attributes={
            "reveille.delivery_id": str(delivery or ""),
            "reveille.session_id": _session_of(event),
            "reveille.event_type": str(event.get("type") or ""),
        },
        record_exception=False,
    ) as span:
        yield span


def _session_of(event: Mapping[str, Any]) -> str:
    return str(
        event.get("origin_ui_session_id")
        or event.get("origin_session_id")
        or event.get("session_key")
        or ""
    )
