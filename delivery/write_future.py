"""The future a thread waits on for one durable write (any backend)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)

_callbacks_lock = threading.Lock()


class WriteFuture(Generic[T]):
    """The outcome of one queued write, for threads.

    A plain lock released once, instead of ``concurrent.futures.Future``'s condition
    variable: at tens of thousands of writes a second the difference shows. Supports what
    callers use: ``result``, ``exception``, ``done`` and ``add_done_callback``.
    """

    __slots__ = ("_callbacks", "_lock", "_ok", "_value")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self._ok: bool | None = None
        self._value: Any = None
        self._callbacks: list[Callable[[WriteFuture[T]], object]] | None = None

    def done(self) -> bool:
        return self._ok is not None

    def _wait(self, timeout: float | None) -> None:
        if self._ok is None:
            if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
                raise TimeoutError(f"the write did not commit within {timeout} s")
            self._lock.release()  # let any other waiter through too

    def result(self, timeout: float | None = None) -> T:
        self._wait(timeout)
        if self._ok:
            return self._value
        raise self._value

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._wait(timeout)
        return None if self._ok else self._value

    def add_done_callback(self, fn: Callable[[WriteFuture[T]], object]) -> None:
        with _callbacks_lock:
            if self._ok is None:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(fn)
                return
        fn(self)

    def _settle(self, ok: bool, value: Any) -> None:
        with _callbacks_lock:
            self._ok, self._value = ok, value
            callbacks, self._callbacks = self._callbacks, None
        self._lock.release()
        for fn in callbacks or ():
            try:
                fn(self)
            except Exception:
                log.exception("a write's done-callback failed")
