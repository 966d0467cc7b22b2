"""How `reveille` writes its log: one line per record on stderr, as text or as JSON, written
by a thread of its own so that the event loop never waits on the terminal or a pipe.

``configure(verbose=, fmt=)`` is called once by the CLI. ``fmt`` is ``"text"`` (the default)
or ``"json"`` (``--log-format json``, ``REVEILLE_LOG_FORMAT``): one object per line with
``time``, ``level``, ``logger``, ``message`` (and ``worker``/``pid`` in a worker of
``--workers N``, ``exception`` when there is one), for log shippers. ``tag_worker(index)``
names the worker in every later line.
"""

from __future__ import annotations

import atexit
import collections
import json
import logging
import logging.handlers
import os
import sys
import threading
import time
from typing import Any, TextIO

__all__ = ["FORMATS", "JsonFormatter", "configure", "tag_worker"]

FORMATS = ("text", "json")
_TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_WORKER_TEXT = "%(asctime)s %(levelname)s worker {index} (pid {pid}) %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record (``worker``: the worker's index, when it is one)."""

    def __init__(self, worker: int | None = None) -> None:
        super().__init__()
        self.worker = worker

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self.worker is not None:
            line["worker"] = self.worker
            line["pid"] = os.getpid()
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


_handler: logging.Handler | None = None
_fmt = "text"


class _Records:
    """The records on their way to the writer thread. A put wakes the writer only when it
    waits for work: after writing what was queued it lingers before it waits, so a busy
    server's lines cost the event loop a deque append each, not a thread wake-up each; a
    line after a quiet spell still wakes it at once.

    The linger is short (5 ms) while lines come now and then, and long (50 ms) while they
    come fast (``busy_rate`` lines a second or more, measured since the writer last looked):
    a busy server's writer then wakes a few dozen times a second and writes a batch each
    time. Each wake-up takes the GIL from the event loop, and at 5 ms those wake-ups cost a
    busy server about a tenth of its CPU per turn (``bench/api_server.py`` measured it). A
    line is written at most a linger later."""

    def __init__(
        self, linger: float = 0.005, busy_linger: float = 0.05, busy_rate: float = 200.0
    ) -> None:
        self._items: collections.deque[logging.LogRecord | None] = collections.deque()
        self._linger = linger
        self._busy_linger = busy_linger
        self._busy_rate = busy_rate
        self._waiting = False
        self._wake = threading.Event()
        self._puts = 0  # every put, counted (the rate the linger follows)
        self._puts_seen = 0
        self._seen_at = time.monotonic()

    def put_nowait(self, record: logging.LogRecord | None) -> None:
        self._items.append(record)
        self._puts += 1
        if self._waiting:
            self._wake.set()

    def empty(self) -> bool:
        return not self._items

    def _next_linger(self) -> float:
        now = time.monotonic()
        rate = (self._puts - self._puts_seen) / max(now - self._seen_at, 0.001)
        self._puts_seen, self._seen_at = self._puts, now
        return self._busy_linger if rate >= self._busy_rate else self._linger

    def get(self, block: bool = True) -> logging.LogRecord | None:
        items = self._items
        while True:
            if items:
                return items.popleft()
            time.sleep(self._next_linger())  # lines put meanwhile wake nobody
            if items:
                return items.popleft()
            # Waiting from here: a put now sets the event (the check after the flag
            # catches one that came just before it).
            self._waiting = True
            if not items:
                self._wake.wait()
            self._wake.clear()
            self._waiting = False


class _HandOff(logging.handlers.QueueHandler):
    """Hands the record itself to the writer thread, which formats it there: a log call
    costs the event loop a queue put, not a formatting. (Records carry their arguments as
    given; the ones Reveille logs are strings and numbers, which nothing changes later.)"""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        return record

    def handle(self, record: logging.LogRecord) -> bool:
        # Without filters of its own the record goes straight into the records, which
        # need no lock: ``Handler.handle`` would filter it, take the handler's lock, emit,
        # prepare and enqueue it, a call each on the event loop for every line.
        if self.filters:
            return bool(super().handle(record))
        try:
            self.queue.put_nowait(record)
        except Exception:
            self.handleError(record)
        return True


class _TextFormatter(logging.Formatter):
    """``logging.Formatter`` with a %-style format that names the time: a record without an
    exception or stack is formatted in one step (its message, its time, the format filled
    from the record), the text ``logging.Formatter`` writes, without its calls to ask
    whether the format uses the time and to hand the record to its style; the writer
    thread formats every line."""

    def __init__(self, fmt: str) -> None:
        super().__init__(fmt)
        if not self.usesTime():  # a check ``python -O`` keeps, unlike an assert
            raise ValueError(f"a text log format must name the time: {fmt!r}")

    def format(self, record: logging.LogRecord) -> str:
        if record.exc_info or record.exc_text or record.stack_info:
            return super().format(record)
        record.message = record.getMessage()
        record.asctime = self.formatTime(record, self.datefmt)
        return self._fmt % record.__dict__  # type: ignore[operator]  # PercentStyle's


class _Lines(logging.StreamHandler[TextIO]):
    """stderr, flushed by the writer once it has written what was queued, not per line:
    a busy server's lines go out in a few writes instead of one each. Only the writer
    thread writes and flushes it: a record is emitted without a filter or a lock (the
    filters, when any, are asked as ``Handler.handle`` asks them)."""

    def handle(self, record: logging.LogRecord) -> bool:
        if self.filters:
            return bool(super().handle(record))
        self.emit(record)
        return True

    def emit(self, record: logging.LogRecord) -> None:
        # Asks the formatter itself (``Handler.format`` only picks it): a call less a line.
        formatter = self.formatter
        try:
            text = formatter.format(record) if formatter is not None else self.format(record)
            self.stream.write(text + self.terminator)
        except Exception:
            self.handleError(record)


class _Writer(logging.handlers.QueueListener):
    def __init__(self, records: _Records, *handlers: Any) -> None:
        super().__init__(records, *handlers, respect_handler_level=False)
        self.records = records
        # The records' own get: one call a record (``QueueListener.dequeue`` adds one).
        self.dequeue = records.get  # type: ignore[method-assign,assignment]

    def handle(self, record: logging.LogRecord) -> None:
        # Every handler takes every record (no level asked of them, as before), as given
        # (``prepare`` is the identity here): ``QueueListener.handle``, without its calls.
        for handler in self.handlers:
            handler.handle(record)
        if self.records.empty():
            for handler in self.handlers:
                handler.flush()


def configure(*, verbose: bool = False, fmt: str = "text") -> None:
    """Log to stderr in ``fmt`` from a writer thread (records are formatted there too)."""
    global _handler, _fmt
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    _fmt = fmt
    # No line names a thread or a process by its record (a worker's pid is written into its
    # format): each record skips finding them, on the event loop.
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    # Nor where it was logged from (no format has %(filename)s, %(lineno)d or %(funcName)s):
    # finding the caller walks the stack on every call (the logging HOWTO's "Optimization").
    logging._srcfile = None
    stream = _Lines(sys.stderr)
    stream.setFormatter(JsonFormatter() if fmt == "json" else _TextFormatter(_TEXT))
    records = _Records()
    listener = _Writer(records, stream)
    listener.start()
    atexit.register(listener.stop)  # what is queued is written before the process ends
    _handler = stream
    root = logging.getLogger()
    root.handlers[:] = [_HandOff(records)]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)


def tag_worker(index: int) -> None:
    """Every later line names worker ``index`` (and its pid)."""
    if _handler is None:
        return
    if _fmt == "json":
        _handler.setFormatter(JsonFormatter(worker=index))
    else:
        _handler.setFormatter(_TextFormatter(_WORKER_TEXT.format(index=index, pid=os.getpid())))
