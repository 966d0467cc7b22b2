"""Rate-limited logging (issue 20, item 3): a condition that repeats logs once per interval
with a count, never a traceback per request."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import aiohttp
import pytest

from gateway.surfaces.api_server.adapter import ApiServerAdapter
from reveille.log_limits import LIMITED_LOGGERS, RateLimit, rate_limited_logs
from tests.webui.conftest import settings_for, start_web, stop_web


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _failure(logger: logging.Logger, where: str = "a") -> None:
    try:
        raise KeyError(where)
    except KeyError:
        logger.exception("unhandled error in %s %s", "GET", f"/{where}")


@pytest.fixture
def limited(
    caplog: pytest.LogCaptureFixture,
) -> Iterator[tuple[logging.Logger, RateLimit, Clock]]:
    caplog.set_level(logging.INFO)
    clock = Clock()
    limit = RateLimit(60.0, clock=clock)
    logger = logging.getLogger("tests.log_limits")
    logger.addFilter(limit)
    yield logger, limit, clock
    logger.removeFilter(limit)


def test_a_repeated_condition_logs_once_then_a_count_without_tracebacks(
    limited: tuple[logging.Logger, RateLimit, Clock], caplog: pytest.LogCaptureFixture
) -> None:
    logger, limit, clock = limited
    for _ in range(1000):
        _failure(logger)
    assert len(caplog.records) == 1 and caplog.records[0].exc_info is not None
    assert caplog.text.count("Traceback") == 1
    clock.now += 61
    _failure(logger)  # the next window's first record carries the last window's count
    record = caplog.records[-1]
    assert record.exc_info is None and caplog.text.count("Traceback") == 1
    assert "[and 999 more like it in the last 61 s]" in record.getMessage()
    assert "KeyError" in record.getMessage()
    for _ in range(10):
        _failure(logger)
    clock.now += 61
    limit.flush()  # a window that ended with repeats is summed up without waiting
    assert "[repeated 10 times in the last 61 s]" in caplog.records[-1].getMessage()
    assert len(caplog.records) == 3 and caplog.text.count("Traceback") == 1


def test_conditions_are_told_apart_and_quiet_ones_forgotten(
    limited: tuple[logging.Logger, RateLimit, Clock], caplog: pytest.LogCaptureFixture
) -> None:
    logger, limit, clock = limited
    _failure(logger, "a")
    _failure(logger, "a")
    logger.warning("another condition %d", 1)
    logger.warning("another condition %d", 2)
    logger.info("a %s line", "third")
    assert [r.getMessage() for r in caplog.records] == [
        "unhandled error in GET /a",
        "another condition 1",
        "a third line",
    ]
    clock.now += 61
    limit.flush()  # the first had a repeat: counted; the others were quiet: forgotten
    assert "[repeated 1 times" in caplog.records[-1].getMessage()
    logger.info("a %s line", "third")
    assert caplog.records[-1].getMessage() == "a third line"


async def test_a_500_per_request_logs_one_traceback_with_a_count(
    tmp_path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The attack: 200 requests that each end in an unexpected error (a 500)."""

    async def broken(self: ApiServerAdapter, request: aiohttp.web.Request) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(ApiServerAdapter, "_list_models", broken)
    caplog.set_level(logging.INFO)
    web = await start_web(settings_for(tmp_path))
    try:
        port = web.app.adapter.port
        for name in LIMITED_LOGGERS:
            assert any(isinstance(f, RateLimit) for f in logging.getLogger(name).filters)
        async with aiohttp.ClientSession() as http:
            for _ in range(200):
                async with http.get(
                    f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": "Bearer k"}
                ) as resp:
                    assert resp.status == 500
    finally:
        await stop_web(web)
    errors = [r for r in caplog.records if r.name == "gateway.http.middleware"]
    assert len(errors) == 2, [r.getMessage() for r in errors]
    assert errors[0].exc_info is not None and errors[1].exc_info is None
    assert "[repeated 199 times" in errors[1].getMessage()
    assert caplog.text.count("Traceback") == 1
    # Left as it was found: no filter outlives the servers.
    for name in LIMITED_LOGGERS:
        assert not any(isinstance(f, RateLimit) for f in logging.getLogger(name).filters)


async def test_servers_in_one_process_share_the_limit() -> None:
    async with rate_limited_logs() as first, rate_limited_logs() as second:
        assert first is second
        assert first in logging.getLogger("asyncio").filters
    assert first not in logging.getLogger("asyncio").filters
