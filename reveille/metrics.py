"""Prometheus metrics: ``GET /metrics`` on the API server's port (``prometheus-client``).

The only module that imports the metrics library. The core exposes plain numbers and hooks;
this module reads them:

* the runner's outcome hook (``GatewayRunner(on_outcome=...)``, the one place deliveries are
  settled): deliveries by platform and outcome, attempts (claims), wake-up deliveries,
  completion-to-delivered latency;
* the turn services' counters (``TurnService.wake_turns``, ``active_runs``): wake-up turns by
  platform, active runs;
* the ledger and the session store writers' ``stats()`` (commits, operations) and the
  ledger's ``delivery_counts()`` (pending and claimed rows), read at scrape time;
* the webhook store's ``endpoint_stats()``, read at scrape time: per endpoint, rows owed,
  delivered and failed, and the age of the oldest owed row;
* what the store holds, read at scrape time so that every server sharing it reports the
  same: the ledger's ``pending_counts`` (rows owing a delivery by lifecycle state, and those
  not due yet: the ledger has no timers of its own yet, so "due later" means backing off),
  the Responses API's ``status_counts`` and the session store's ``approval_counts``;
* an aiohttp middleware on the API server: requests by route and status, with latency.

``/metrics`` answers 401 without the bearer key when one is configured. A scrape reads the
stores on a worker thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeAlias

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from delivery.responses_backend import ACTIVE, TERMINAL
from delivery.rows import PendingCounts
from delivery.webhooks_backend import EndpointStats
from gateway.http.middleware import PORT_MIDDLEWARE_KEY
from gateway.outcomes import DeliveryOutcome
from gateway.webhooks import public_endpoint

__all__ = ["Metrics"]

logger = logging.getLogger(__name__)

# Named counters a store or writer reports (``stats()``, ``delivery_counts()``).
Counts: TypeAlias = Mapping[str, float]

_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600, 6 * 3600)
# Always reported, 0 when the store has none, so every series exists from the first scrape.
_RESPONSE_STATUSES = (*ACTIVE, *TERMINAL)
_APPROVAL_STATUSES = ("pending", "approved", "denied", "expired")
_WORK_STATES = ("queued", "running")
# Request series kept found (route x method x status); a route table's worth and more.
_MAX_CACHED_SERIES = 1024
_REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class _Snapshot(Collector):
    """Families read at scrape time from what the core exposes."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Any]:
        m = self.metrics
        runs = GaugeMetricFamily(
            "reveille_active_runs", "Agent turns running now", labels=["platform"]
        )
        wakes = CounterMetricFamily(
            "reveille_wake_turns", "Wake-up turns run, by platform", labels=["platform"]
        )
        for platform, turns in m.turn_services.items():
            runs.add_metric([platform], float(getattr(turns, "active_runs", 0)))
            wakes.add_metric([platform], float(getattr(turns, "wake_turns", 0)))
        yield runs
        yield wakes

        rows = GaugeMetricFamily(
            "reveille_delivery_rows", "Ledger rows waiting for delivery", labels=["state"]
        )
        counts = _safe(m.ledger_counts)
        if counts:
            for state in ("pending", "claimed"):
                rows.add_metric([state], float(counts.get(state, 0)))
        yield rows

        yield from self._store_families()

        commits = CounterMetricFamily(
            "reveille_writer_commits", "SQLite writer commits", labels=["store"]
        )
        durable = CounterMetricFamily(
            "reveille_writer_durable_commits",
            "SQLite writer commits with an fsync",
            labels=["store"],
        )
        ops = CounterMetricFamily(
            "reveille_writer_operations",
            "Operations committed by the SQLite writer",
            labels=["store"],
        )
        per = GaugeMetricFamily(
            "reveille_writer_operations_per_commit",
            "Operations per commit since start (group commit batching)",
            labels=["store"],
        )
        for store, read in m.writers.items():
            stats = _safe(read)
            if not stats:
                continue
            n_ops = float(stats.get("operations", stats.get("writes", 0)))
            n_commits = float(stats.get("commits", 0))
            commits.add_metric([store], n_commits)
            durable.add_metric([store], float(stats.get("durable_commits", 0)))
            ops.add_metric([store], n_ops)
            per.add_metric([store], n_ops / n_commits if n_commits else 0.0)
        yield commits
        yield durable
        yield ops
        yield per

    def _store_families(self) -> Iterator[Any]:
        m = self.metrics
        if m.ledger_pending is not None:
            try:
                pending = m.ledger_pending(time.time())
            except Exception:
                logger.debug("metrics source failed", exc_info=True)
            else:
                by_state = GaugeMetricFamily(
                    "reveille_ledger_pending_rows",
                    "Ledger rows that owe a delivery, by lifecycle state (queued, running: "
                    "the work has not ended; a terminal state: its result is owed)",
                    labels=["state"],
                )
                for state, count in _with_defaults(pending.by_state, _WORK_STATES):
                    by_state.add_metric([state], float(count))
                yield by_state
                later = GaugeMetricFamily(
                    "reveille_ledger_rows_due_later",
                    "Ledger rows owing a delivery that is not due yet (backing off)",
                )
                later.add_metric([], float(pending.due_later))
                yield later
        for name, doc, read, known in (
            (
                "reveille_responses",
                "Stored Responses API responses by status",
                m.response_counts,
                _RESPONSE_STATUSES,
            ),
            (
                "reveille_approvals",
                "Approval requests in the store by status (pending; decided ones while kept)",
                m.approval_counts,
                _APPROVAL_STATUSES,
            ),
        ):
            counts = _safe(read)
            if counts is None:
                continue
            family = GaugeMetricFamily(name, doc, labels=["status"])
            for status, count in _with_defaults(counts, known):
                family.add_metric([status], float(count))
            yield family


def _with_defaults(counts: Counts, known: tuple[str, ...]) -> list[tuple[str, float]]:
    """``counts`` with every ``known`` key present (0 when absent), known keys first."""
    return [(k, counts.get(k, 0)) for k in known] + [
        (k, v) for k, v in sorted(counts.items()) if k not in known
    ]


class _Webhooks(Collector):
    """Per-endpoint webhook families, read from the store at scrape time (so every server
    on a shared store reports the same obligations)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Any]:
        read = self.metrics.webhook_stats
        if read is None:
            return
        try:
            stats = read()
        except Exception:  # a closed store while shutting down, say
            logger.debug("webhook metrics source failed", exc_info=True)
            return
        owed = GaugeMetricFamily(
            "reveille_webhook_owed", "Webhook rows not yet delivered", labels=["endpoint"]
        )
        delivered = GaugeMetricFamily(
            "reveille_webhook_delivered", "Webhook rows delivered (2xx)", labels=["endpoint"]
        )
        failed = GaugeMetricFamily(
            "reveille_webhook_failed",
            "Webhook rows given up (410 Gone or the retry window ended)",
            labels=["endpoint"],
        )
        age = GaugeMetricFamily(
            "reveille_webhook_oldest_owed_age_seconds",
            "Age of the oldest webhook row still owed (0: none)",
            labels=["endpoint"],
        )
        now = time.time()
        for s in _by_public_endpoint(stats):
            owed.add_metric([s.endpoint], float(s.owed))
            delivered.add_metric([s.endpoint], float(s.delivered))
            failed.add_metric([s.endpoint], float(s.failed))
            oldest = s.oldest_owed_at
            age.add_metric([s.endpoint], 0.0 if oldest is None else max(now - oldest, 0.0))
        yield from (owed, delivered, failed, age)


def _by_public_endpoint(stats: Sequence[EndpointStats]) -> list[EndpointStats]:
    """The stats labelled by the endpoint without its credentials or query (a token the
    receiver checks is no label); endpoints that differ only there are added up."""
    merged: dict[str, EndpointStats] = {}
    for s in stats:
        label = public_endpoint(s.endpoint)
        m = merged.get(label)
        if m is None:
            merged[label] = replace(s, endpoint=label)
            continue
        oldest = [t for t in (m.oldest_owed_at, s.oldest_owed_at) if t is not None]
        merged[label] = EndpointStats(
            label,
            m.owed + s.owed,
            m.delivered + s.delivered,
            m.failed + s.failed,
            min(oldest) if oldest else None,
        )
    return list(merged.values())


def _safe(read: Callable[[], Counts | None] | None) -> Counts | None:
    if read is None:
        return None
    try:
        return read()
    except Exception:  # a closed store while shutting down, say
        logger.debug("metrics source failed", exc_info=True)
        return None


class Metrics:
    """The registry of one ``reveille serve`` process (not the library's global one)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.turn_services: dict[str, object] = {}  # read with getattr: any turn service
        self.writers: dict[str, Callable[[], Counts | None]] = {}
        self.ledger_counts: Callable[[], Counts | None] | None = None
        self.webhook_stats: Callable[[], Sequence[EndpointStats]] | None = None
        # Read from the store at scrape time (``watch_store``).
        self.ledger_pending: Callable[[float], PendingCounts] | None = None
        self.response_counts: Callable[[], dict[str, int]] | None = None
        self.approval_counts: Callable[[], dict[str, int]] | None = None
        self.deliveries = Counter(
            "reveille_deliveries",
            "Completions handled by the runner, by the platform of their session and outcome "
            "(delivered, released, retryable, dropped, held, foreign, ignored)",
            ["platform", "outcome"],
            registry=self.registry,
        )
        self.attempts = Counter(
            "reveille_delivery_attempts",
            "Delivery claims made (each counts one attempt; retryable releases refund theirs)",
            ["platform"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "reveille_delivery_latency_seconds",
            "From the work's completion to its delivery",
            ["platform"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.requests = Counter(
            "reveille_api_requests",
            "API server requests by route and status",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.request_latency = Histogram(
            "reveille_api_request_duration_seconds",
            "API server request latency by route",
            ["route", "method"],
            buckets=_REQUEST_BUCKETS,
            registry=self.registry,
        )
        self._series: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}
        # The same series by the matched route itself (``count``): no pattern read per request.
        self._route_series: dict[tuple[web.AbstractRoute, str, int], tuple[Counter, Histogram]]
        self._route_series = {}
        self.scrapes = Gauge(
            "reveille_metrics_scrape_timestamp_seconds",
            "When /metrics was last read",
            registry=self.registry,
        )
        self.registry.register(_Snapshot(self))
        self.registry.register(_Webhooks(self))

    # ----------------------------------------------------------------- sources

    def observe(self, outcome: DeliveryOutcome) -> None:
        """The runner's outcome hook."""
        platform = outcome.platform.value if outcome.platform is not None else "none"
        self.deliveries.labels(platform, outcome.outcome).inc()
        if outcome.claimed:
            self.attempts.labels(platform).inc()
        if outcome.outcome == "delivered" and outcome.completed_at is not None:
            self.latency.labels(platform).observe(max(time.time() - outcome.completed_at, 0.0))

    def watch_turns(self, platform: str, turns: Any) -> None:
        self.turn_services[platform] = turns

    def watch_writer(self, store: str, read: Callable[[], Counts | None]) -> None:
        self.writers[store] = read

    def watch_store(
        self,
        *,
        ledger_pending: Callable[[float], PendingCounts] | None = None,
        responses: Callable[[], dict[str, int]] | None = None,
        approvals: Callable[[], dict[str, int]] | None = None,
    ) -> None:
        """The store's counts each scrape reads (only those given are replaced)."""
        self.ledger_pending = ledger_pending or self.ledger_pending
        self.response_counts = responses or self.response_counts
        self.approval_counts = approvals or self.approval_counts

    # ----------------------------------------------------------------- HTTP

    def _request_series(self, route: str, method: str, status: int) -> tuple[Counter, Histogram]:
        """The request counter's and latency histogram's series for these labels, found once:
        ``labels()`` takes a lock and builds its key on every call, on every request."""
        key = (route, method, status)
        found = self._series.get(key)
        if found is None:
            found = (
                self.requests.labels(route, method, str(status)),
                self.request_latency.labels(route, method),
            )
            # Methods are the client's to choose: past a bound, look them up each time.
            if len(self._series) < _MAX_CACHED_SERIES:
                self._series[key] = found
        return found

    def install(self, app: web.Application) -> None:
        """Add ``GET /metrics`` and the request middleware to the API server's app (whose
        key middleware guards ``/metrics`` like every other route of the port)."""

        route_series = self._route_series

        def count(request: web.Request, status: int, elapsed: float) -> None:
            method = request.method
            try:
                route = request.match_info.route
            except AttributeError:
                route = None
            found = route_series.get((route, method, status)) if route is not None else None
            if found is None:
                found = self._request_series(_route_of(request), method, status)
                # A route of the app's router (fixed once the app runs: one pattern) is a
                # key; the system routes of 404s and 405s are made per request, and are not.
                if isinstance(route, web.ResourceRoute) and len(route_series) < _MAX_CACHED_SERIES:
                    route_series[route, method, status] = found
            count, latency = found
            count.inc()
            latency.observe(elapsed)

        @web.middleware
        async def count_requests(
            request: web.Request,
            handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
        ) -> web.StreamResponse:
            started = time.perf_counter()
            status = 500
            try:
                response = await handler(request)
                status = response.status
                return response
            except web.HTTPException as exc:
                status = exc.status
                raise
            except Exception as exc:
                status = int(getattr(exc, "status", 500) or 500)
                raise
            finally:
                count(request, status, time.perf_counter() - started)

        async def metrics(request: web.Request) -> web.Response:
            self.scrapes.set(time.time())
            # The collectors read the stores: a thread, never the event loop.
            body = await asyncio.to_thread(generate_latest, self.registry)
            return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

        port = app.get(PORT_MIDDLEWARE_KEY)
        if port is not None:
            # The port's one middleware tells it of each request (``PortMiddleware``), with
            # the status the error shapes answered: no layer of its own.
            port.observe(count)
        else:
            # Outermost, so that it sees the status the error middleware answers with.
            app.middlewares.insert(0, count_requests)
        app.router.add_get("/metrics", metrics)


def _route_of(request: web.Request) -> str:
    """The route's pattern (``/api/sessions/{session_id}``), never the raw path."""
    try:
        info = request.match_info.route.resource
    except AttributeError:
        return "unmatched"
    if info is None:
        return "unmatched"
    return str(info.canonical)
