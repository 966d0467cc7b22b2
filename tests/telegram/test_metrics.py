"""`GET /metrics`: Prometheus text behind the key, and counters that move with deliveries."""

from __future__ import annotations

import urllib.error
from pathlib import Path

from tests.api_server.serve_support import Server, chat, ledger_rows, scrape, value, wait_until
from tests.telegram.conftest import serve
from tests.telegram.fake_bot_api import FakeBotApi


def test_metrics_need_the_key(tmp_path: Path):
    server = Server(tmp_path)
    try:
        try:
            scrape(server.port, key=None)
        except urllib.error.HTTPError as exc:
            assert exc.code == 401
        else:
            raise AssertionError("/metrics answered without the key")
        try:
            scrape(server.port, key="wrong")
        except urllib.error.HTTPError as exc:
            assert exc.code == 401
        else:
            raise AssertionError("/metrics answered with a wrong key")
        # The refusals are counted too, with the status they were answered with.
        refused = value(
            scrape(server.port),
            "reveille_api_requests_total",
            route="/metrics",
            method="GET",
            status="401",
        )
        assert refused == 2
    finally:
        server.stop()


def test_metrics_without_a_key_configured_are_open(tmp_path: Path):
    server = Server(tmp_path, key=None)
    try:
        assert ("reveille_active_runs", (("platform", "api_server"),)) in scrape(server.port, None)
    finally:
        server.stop()


def test_counters_move_with_deliveries(tmp_path: Path, bot: FakeBotApi):
    server = serve(tmp_path, bot)
    try:
        before = scrape(server.port)
        assert (
            value(before, "reveille_deliveries_total", platform="telegram", outcome="delivered")
            == 0
        )
        # A Telegram wake-up, and an API-server one (a background process wakes the session).
        bot.message("in the background: measure me")
        chat(server.port, "run in the background: echo metered")
        wait_until(
            lambda: [r.delivery_state for r in ledger_rows(tmp_path)].count("delivered") == 2,
            timeout=30,
        )
        after = scrape(server.port)
        assert (
            value(after, "reveille_deliveries_total", platform="telegram", outcome="delivered") == 1
        )
        assert (
            value(after, "reveille_deliveries_total", platform="api_server", outcome="delivered")
            == 1
        )
        assert value(after, "reveille_delivery_attempts_total", platform="telegram") == 1
        assert value(after, "reveille_wake_turns_total", platform="telegram") == 1
        assert value(after, "reveille_wake_turns_total", platform="api_server") == 1
        assert value(after, "reveille_delivery_latency_seconds_count", platform="telegram") == 1
        assert value(after, "reveille_delivery_rows", state="pending") == 0
        assert value(after, "reveille_active_runs", platform="telegram") == 0
        assert value(after, "reveille_writer_commits_total", store="ledger") > value(
            before, "reveille_writer_commits_total", store="ledger"
        )
        assert value(after, "reveille_writer_operations_total", store="sessions") > 0
        assert value(after, "reveille_writer_operations_per_commit", store="ledger") >= 1
        assert (
            value(
                after,
                "reveille_api_requests_total",
                route="/v1/chat/completions",
                method="POST",
                status="200",
            )
            >= 2  # the client's turn and the wake-up's self-post
        )
        assert (
            value(
                after, "reveille_api_request_duration_seconds_count", route="/metrics", method="GET"
            )
            >= 1
        )
    finally:
        server.stop()
