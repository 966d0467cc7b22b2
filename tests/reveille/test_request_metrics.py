"""The API requests' series of ``reveille.metrics``: each request counted under its route's
pattern, method and status, whether its series was found by the matched route (routes of
the app) or by the pattern (404s and 405s, whose routes are made per request)."""

from __future__ import annotations

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.exposition import generate_latest

from reveille.metrics import Metrics


def _sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


async def test_requests_count_under_their_routes_patterns() -> None:
    metrics = Metrics()
    app = web.Application()

    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="hi")

    async def item(request: web.Request) -> web.Response:
        if request.match_info["item_id"] == "missing":
            raise web.HTTPNotFound()
        return web.Response(text=request.match_info["item_id"])

    app.router.add_get("/hello", hello)
    app.router.add_get("/items/{item_id}", item)
    metrics.install(app)
    async with TestClient(TestServer(app)) as client:
        for _ in range(3):
            assert (await client.get("/hello")).status == 200
        for name in ("a", "b", "missing", "c"):
            await client.get(f"/items/{name}")
        for _ in range(2):
            assert (await client.get("/nowhere")).status == 404
            assert (await client.post("/hello")).status == 405
    requests = "reveille_api_requests_total"
    assert _sample(metrics, requests, route="/hello", method="GET", status="200") == 3
    assert _sample(metrics, requests, route="/items/{item_id}", method="GET", status="200") == 3
    assert _sample(metrics, requests, route="/items/{item_id}", method="GET", status="404") == 1
    assert _sample(metrics, requests, route="unmatched", method="GET", status="404") == 2
    assert _sample(metrics, requests, route="unmatched", method="POST", status="405") == 2
    latency = "reveille_api_request_duration_seconds_count"
    assert _sample(metrics, latency, route="/items/{item_id}", method="GET") == 4
    assert _sample(metrics, latency, route="/hello", method="GET") == 3
    assert b"/items/a" not in generate_latest(metrics.registry)  # patterns, never paths
