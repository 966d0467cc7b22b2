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
import json
import logging
import logging.handlers
import queue
import sys
import time
from typing import Any

__all__ = ["FORMATS", "JsonFormatter", "configure", "tag_worker"]

FORMATS = ("text", "json")
_TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_WORKER_TEXT = "%(asctime)s %(levelname)s worker {index} (pid %(process)d) %(name)s: %(message)s"


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
            line["pid"] = record.process
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


_handler: logging.Handler | None = None
_fmt = "text"


def configure(*, verbose: bool = False, fmt: str = "text") -> None:
    """Log to stderr in ``fmt`` from a writer thread (records are formatted there too)."""
    global _handler, _fmt
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    _fmt = fmt
    stream = logging.StreamHandler(sys.stderr)
    stream.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(_TEXT))
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    listener = logging.handlers.QueueListener(records, stream, respect_handler_level=False)
    listener.start()
    atexit.register(listener.stop)  # what is queued is written before the process ends
    _handler = stream
    root = logging.getLogger()
    root.handlers[:] = [logging.handlers.QueueHandler(records)]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)


def tag_worker(index: int) -> None:
    """Every later line names worker ``index`` (and its pid)."""
    if _handler is None:
        return
    if _fmt == "json":
        _handler.setFormatter(JsonFormatter(worker=index))
    else:
        _handler.setFormatter(logging.Formatter(_WORKER_TEXT.format(index=index)))
