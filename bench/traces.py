"""What traces cost a turn: the turn span and one tool-call span, with tracing off and on.

In one process, ``--turns`` times: a turn (``delivery.traces.traced_turn``) whose body makes
one tool call through the real ``ToolRegistry`` (a tool that returns at once), so only the
instrumentation and the registry are measured, not a model or a store. Three runs:

* off: no SDK configured (what every server without an OTLP endpoint runs: the API's no-op);
* on, dropped: the SDK's tracer provider with a ``BatchSpanProcessor`` whose exporter drops
  the spans (the SDK's own cost: span objects, ids, attributes, the batch queue);
* on, exported: the same with the SDK's OTLP/HTTP exporter to a collector that is not there
  (what a down collector costs the turn: nothing more, the export runs on its own thread).

Prints microseconds per turn (median of ``--repeats``) for each and what tracing adds.

Usage: python bench/traces.py [--turns 20000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.util._once import Once

from agent.messages import JSONObject
from agent.tools import Tool, ToolContext, ToolRegistry
from delivery import traces


class _Dropped(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def _install(exporter: SpanExporter | None) -> TracerProvider | None:
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None
    if exporter is None:
        return None
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider


async def _per_turn_us(turns: int) -> float:
    async def instant(args: JSONObject, ctx: ToolContext) -> str:
        return "ok"

    registry = ToolRegistry([Tool("instant", "returns at once", {"type": "object"}, instant)])
    ctx = ToolContext(session_id="bench")

    async def body() -> str:
        return await registry.call("instant", "{}", ctx, "call_0")

    started = time.perf_counter()
    for _ in range(turns):
        await traces.traced_turn(body(), session_id="bench", platform="bench", wakeup=False)
    return (time.perf_counter() - started) / turns * 1e6


def _measure(label: str, exporter: SpanExporter | None, turns: int, repeats: int) -> float:
    provider = _install(exporter)
    try:
        runs = [asyncio.run(_per_turn_us(turns)) for _ in range(repeats)]
    finally:
        if provider is not None:
            provider.shutdown()
        _install(None)
    median = statistics.median(runs)
    print(f"{label:<34} {median:8.1f} µs/turn  (runs: {', '.join(f'{r:.1f}' for r in runs)})")
    return median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    print(f"{args.turns} turns x {args.repeats}, each: a turn span + one tool-call span")
    off = _measure("tracing off (no SDK)", None, args.turns, args.repeats)
    dropped = _measure("SDK on, spans dropped", _Dropped(), args.turns, args.repeats)
    down = OTLPSpanExporter(endpoint="http://127.0.0.1:9/v1/traces", timeout=1)
    exported = _measure("SDK on, OTLP to a collector down", down, args.turns, args.repeats)
    print(f"tracing adds {dropped - off:.1f} µs per turn ({exported - off:.1f} with OTLP export)")


if __name__ == "__main__":
    main()
