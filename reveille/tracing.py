"""Traces out of the process: the OpenTelemetry SDK, installed only when an endpoint is set.

The floors below open their spans through ``opentelemetry-api`` alone (``delivery.traces``,
the tool registry), which costs nothing until a tracer provider exists. ``configure`` puts
one in place when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (``[otel] endpoint``) is set: spans go in
batches over OTLP/HTTP to ``{endpoint}/v1/traces`` (or to ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``
as given), as ``service.name`` reveille unless ``OTEL_SERVICE_NAME`` or
``OTEL_RESOURCE_ATTRIBUTES`` say otherwise. The exporter reads the rest of the standard
``OTEL_*`` variables itself (headers, timeout, compression); ``OTEL_SDK_DISABLED=true``
turns it all off. The SDK and the exporter are the optional extra ``reveille[otel]``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from opentelemetry import trace

from reveille import version
from reveille.settings import Settings, SettingsError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

__all__ = ["configure"]

logger = logging.getLogger("reveille.tracing")


def configure(
    settings: Settings,
    environ: Mapping[str, str] | None = None,
    *,
    exporter: SpanExporter | None = None,
) -> Callable[[], None] | None:
    """Install the SDK's tracer provider as this process's, when traces are asked for;
    returns what flushes and closes it at exit (None when tracing stays off).

    ``exporter`` replaces the OTLP one (tests)."""
    env = os.environ if environ is None else environ
    if not settings.otel_endpoint and exporter is None:
        return None
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        logger.info("traces are off: OTEL_SDK_DISABLED is true")
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise SettingsError(
            "otel_endpoint is set but the OpenTelemetry SDK is not installed; "
            "install reveille[otel] (or unset OTEL_EXPORTER_OTLP_ENDPOINT / [otel] endpoint)"
        ) from None
    if exporter is None:
        exporter = _otlp_exporter(settings.otel_endpoint, env)
    attributes = {"service.version": version()}
    if not env.get("OTEL_SERVICE_NAME") and "service.name=" not in env.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    ):
        attributes["service.name"] = "reveille"
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    logger.info("traces go to %s", _where(settings.otel_endpoint, env) or "the given exporter")
    return provider.shutdown


def _otlp_exporter(endpoint: str, env: Mapping[str, str]) -> SpanExporter:
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        raise SettingsError(
            "otel_endpoint is set but the OTLP exporter is not installed; install reveille[otel]"
        ) from None
    if env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return OTLPSpanExporter()  # the exporter takes that one as given
    return OTLPSpanExporter(endpoint=_traces_url(endpoint))


def _traces_url(endpoint: str) -> str:
    # The base endpoint's rule in the OTLP spec: signal paths are appended to it.
    return endpoint.rstrip("/") + "/v1/traces"


def _where(endpoint: str, env: Mapping[str, str]) -> str:
    return env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or (
        _traces_url(endpoint) if endpoint else ""
    )
