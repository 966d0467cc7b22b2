"""Rate-limited logging: a condition that repeats is logged once per interval, with a count,
never as a traceback per request.

A condition is a logger, a message template (before its arguments are filled in) and, for a
record that carries an exception, the exception's type and the line that raised it. The
first record of a condition passes as it is, traceback included. Further records of it
within ``interval`` seconds are only counted; the count goes out as one line
(``… [repeated N times in the last S s]``, without a traceback) when the window ends, either
with the next record of the condition or with the periodic flush. A condition quiet for a
whole window is forgotten.

``rate_limited_logs()`` puts one shared ``RateLimit`` on the loggers a client can make
talk (``LIMITED_LOGGERS``: asyncio's accept errors, aiohttp's server, Reveille's HTTP
surfaces) for as long as it is entered; the composition root enters it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

__all__ = ["DEFAULT_INTERVAL_SECONDS", "LIMITED_LOGGERS", "RateLimit", "rate_limited_logs"]

DEFAULT_INTERVAL_SECONDS = 60.0
LIMITED_LOGGERS = (
    "asyncio",
    "aiohttp.access",
    "aiohttp.internal",
    "aiohttp.server",
    "aiohttp.web",
    "api.event_log",
    "api.event_stream",
    "api.server",
    "api.web_turns",
    "gateway.surfaces.api_server.adapter",
    "gateway.surfaces.api_server.sessions",
    "gateway.http.connection_guard",
    "gateway.http.middleware",
)
_SUMMARY = "reveille_rate_limit_summary"
_MAX_CONDITIONS = 1024

Condition = tuple[str, str, str]


@dataclass(slots=True)
class _Window:
    start: float
    repeats: int = 0
    last: logging.LogRecord | None = None


def condition_of(record: logging.LogRecord) -> Condition:
    """What makes two records "the same condition"."""
    where = ""
    if record.exc_info and record.exc_info[0] is not None:
        tb = record.exc_info[2]
        frames = traceback.extract_tb(tb) if tb is not None else []
        origin = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else ""
        where = f"{record.exc_info[0].__qualname__}@{origin}"
    return record.name, str(record.msg), where


class RateLimit(logging.Filter):
    """Lets each condition through once per ``interval`` seconds and counts the rest."""

    def __init__(
        self,
        interval: float = DEFAULT_INTERVAL_SECONDS,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.interval = interval
        self._clock = clock
        self._windows: OrderedDict[Condition, _Window] = OrderedDict()
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, _SUMMARY, False):
            return True
        key = condition_of(record)
        now = self._clock()
        with self._lock:
            window = self._windows.get(key)
            if window is None:
                self._windows[key] = _Window(start=now)
                while len(self._windows) > _MAX_CONDITIONS:
                    self._windows.popitem(last=False)
                return True
            if now - window.start < self.interval:
                window.repeats += 1
                window.last = record
                return False
            repeats, elapsed = window.repeats, now - window.start
            window.start, window.repeats, window.last = now, 0, None
            self._windows.move_to_end(key)
        # A condition that keeps coming: no traceback again, the count of the last window.
        _shorten(record, repeats, elapsed)
        return True

    def flush(self) -> None:
        """Log the count of every window that ended with repeats; forget quiet conditions."""
        now = self._clock()
        summaries: list[logging.LogRecord] = []
        with self._lock:
            for key, window in list(self._windows.items()):
                if now - window.start < self.interval:
                    continue
                if window.last is None:
                    del self._windows[key]
                    continue
                last = window.last
                summary = logging.LogRecord(  # stamped now, where it was logged
                    last.name,
                    last.levelno,
                    last.pathname,
                    last.lineno,
                    last.msg,
                    last.args,
                    last.exc_info,
                    last.funcName,
                )
                _shorten(summary, window.repeats, now - window.start, counted=True)
                setattr(summary, _SUMMARY, True)
                summaries.append(summary)
                window.start, window.repeats, window.last = now, 0, None
        for summary in summaries:
            logging.getLogger(summary.name).handle(summary)


def _shorten(
    record: logging.LogRecord, repeats: int, elapsed: float, *, counted: bool = False
) -> None:
    """No traceback, the exception as one line, and the count of the window behind it."""
    text = str(record.msg)
    if record.exc_info and record.exc_info[1] is not None:
        exc = record.exc_info[1]
        line = f" ({type(exc).__name__}: {str(exc)[:200]})"
        text += line.replace("%", "%%") if record.args else line
    record.exc_info = None
    record.exc_text = None
    record.stack_info = None
    if counted:
        text += f" [repeated {repeats} times in the last {elapsed:.0f} s]"
    elif repeats:
        text += f" [and {repeats} more like it in the last {elapsed:.0f} s]"
    record.msg = text


_lock = threading.Lock()
_shared: RateLimit | None = None
_users = 0


def _acquire(interval: float) -> RateLimit:
    global _shared, _users
    with _lock:
        if _shared is None:
            _shared = RateLimit(interval)
            for name in LIMITED_LOGGERS:
                logging.getLogger(name).addFilter(_shared)
        _users += 1
        return _shared


def _release() -> None:
    global _shared, _users
    with _lock:
        _users -= 1
        if _users or _shared is None:
            return
        limit, _shared = _shared, None
        for name in LIMITED_LOGGERS:
            logging.getLogger(name).removeFilter(limit)
    limit.interval = 0.0  # every window has ended: log what is still counted
    limit.flush()


@contextlib.asynccontextmanager
async def rate_limited_logs(
    interval: float = DEFAULT_INTERVAL_SECONDS,
) -> AsyncIterator[RateLimit]:
    """The shared ``RateLimit`` on ``LIMITED_LOGGERS`` while entered (servers in one process
    share it), flushed every quarter interval and once more at the end."""
    limit = _acquire(interval)

    async def flush_regularly() -> None:
        while True:
            await asyncio.sleep(limit.interval / 4)
            limit.flush()

    task = asyncio.create_task(flush_regularly())
    try:
        yield limit
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        _release()
