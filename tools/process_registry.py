"""Background shell processes and the completion queue every consumer drains.

``process_registry.completion_queue`` is the one hand-off point between work that finished
and whoever delivers it: worker threads put events, the gateway watcher (asyncio) and other
consumers take them. It blocks without polling on both sides.

``process_registry.spawn`` runs a real subprocess in the background. Its ledger row is
written before the process starts and its completion (exit code, duration, a bounded tail
of the output) is written to the ledger before it is queued, so it survives a restart.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import queue
import signal
import subprocess
import threading
import time
from typing import Any

from delivery.ids import new_id

log = logging.getLogger(__name__)

OUTPUT_TAIL_BYTES = 16 * 1024


class CompletionQueue:
    """A FIFO like ``queue.Queue`` that asyncio code can also await without polling."""

    def __init__(self) -> None:
        self._items: collections.deque[dict[str, Any]] = collections.deque()
        self._cond = threading.Condition()
        self._async_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def put(self, item: dict[str, Any], block: bool = True, timeout: float | None = None) -> None:
        with self._cond:
            self._items.append(item)
            self._cond.notify()
            waiters, self._async_waiters = self._async_waiters, []
        for loop, fut in waiters:
            # A waiter only learns "look again"; the item stays here until someone takes
            # it, so a cancelled waiter can never swallow an event.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_wake, fut)

    put_nowait = put

    def get(self, block: bool = True, timeout: float | None = None) -> dict[str, Any]:
        with self._cond:
            if not block:
                if not self._items:
                    raise queue.Empty
                return self._items.popleft()
            if not self._cond.wait_for(lambda: self._items, timeout):
                raise queue.Empty
            return self._items.popleft()

    def get_nowait(self) -> dict[str, Any]:
        return self.get(block=False)

    async def get_async(self) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        while True:
            with self._cond:
                if self._items:
                    return self._items.popleft()
                fut: asyncio.Future[None] = loop.create_future()
                self._async_waiters.append((loop, fut))
            await fut

    def qsize(self) -> int:
        return len(self._items)

    def empty(self) -> bool:
        return not self._items

    def drain(self) -> list[dict[str, Any]]:
        with self._cond:
            items = list(self._items)
            self._items.clear()
            return items


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class _Tail:
    """The last ``limit`` bytes of a stream."""

    def __init__(self, limit: int = OUTPUT_TAIL_BYTES) -> None:
        self._chunks: collections.deque[bytes] = collections.deque()
        self._size = 0
        self._limit = limit
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._size += len(chunk)
        self.total += len(chunk)
        while self._size - len(self._chunks[0]) >= self._limit:
            self._size -= len(self._chunks.popleft())

    def text(self) -> str:
        data = b"".join(self._chunks)[-self._limit :]
        return data.decode("utf-8", errors="replace")


class _Running:
    def __init__(self, process_id: str, proc: subprocess.Popen[bytes], command: str) -> None:
        self.process_id = process_id
        self.proc = proc
        self.command = command
        self.tail = _Tail()
        self.started = time.time()
        self.kill_requested = False


class ProcessRegistry:
    def __init__(self) -> None:
        self.completion_queue = CompletionQueue()
        self._running: dict[str, _Running] = {}
        self._lock = threading.Lock()

    def spawn(
        self,
        command: str,
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        session_key: str | None = None,
        origin_session_id: str | None = None,
        origin_ui_session_id: str | None = None,
        notify_on_complete: bool = True,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Start ``command`` in the background; its completion is recorded and, if asked, queued."""
        from tools.async_delegation import get_runtime

        if not isinstance(command, str) or not command.strip():
            raise ValueError("command must be a non-empty string")
        ledger = get_runtime().ledger
        process_id = new_id("proc_")
        request = {
            "type": "completion",
            "delivery_id": process_id,
            "process_id": process_id,
            "command": command,
            "cwd": cwd,
            "session_key": session_key,
            "origin_session_id": origin_session_id,
            "origin_ui_session_id": origin_ui_session_id,
            "notify_on_complete": notify_on_complete,
            "dispatched_at": time.time(),
        }
        ledger.create(
            process_id,
            kind="process",
            state="running",
            session_key=session_key,
            origin_session_id=origin_session_id,
            origin_ui_session_id=origin_ui_session_id,
            goal=command,
            request=request,
        )
        if not notify_on_complete:
            # Nobody is to be told: the row records the run and its result, nothing more.
            ledger.drop(process_id, "notify_on_complete was off; result kept")
        try:
            proc = subprocess.Popen(
                command,
                shell=True,
                cwd=cwd,
                env={**os.environ, **env} if env else None,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group, so kill() reaches its children
            )
        except OSError as exc:
            self._finish(
                process_id,
                request,
                exit_code=None,
                output="",
                error=str(exc),
                started=time.time(),
                killed=False,
            )
            raise
        running = _Running(process_id, proc, command)
        with self._lock:
            self._running[process_id] = running
        threading.Thread(
            target=self._watch,
            args=(running, request, timeout),
            name=f"proc-{process_id}",
            daemon=True,
        ).start()
        return {
            "process_id": process_id,
            "pid": proc.pid,
            "status": "running",
            "notify_on_complete": notify_on_complete,
        }

    def _watch(self, running: _Running, request: dict[str, Any], timeout: float | None) -> None:
        proc = running.proc
        timer = None
        if timeout:
            timer = threading.Timer(timeout, self.kill, args=(running.process_id,))
            timer.daemon = True
            timer.start()
        assert proc.stdout is not None
        for chunk in iter(lambda: proc.stdout.read1(65536), b""):  # type: ignore[union-attr]
            running.tail.feed(chunk)
        code = proc.wait()
        if timer:
            timer.cancel()
        with self._lock:
            self._running.pop(running.process_id, None)
        self._finish(
            running.process_id,
            request,
            exit_code=code,
            output=running.tail.text(),
            error=None,
            started=running.started,
            killed=running.kill_requested,
            output_bytes=running.tail.total,
        )

    def _finish(
        self,
        process_id: str,
        request: dict[str, Any],
        *,
        exit_code: int | None,
        output: str,
        error: str | None,
        started: float,
        killed: bool,
        output_bytes: int = 0,
    ) -> None:
        from tools.async_delegation import get_runtime

        now = time.time()
        if error is not None:
            status = "error"
        elif killed:
            status = "cancelled"
        else:
            status = "completed" if exit_code == 0 else "failed"
        event = {
            **request,
            "status": status,
            "exit_code": exit_code,
            "output_tail": output,
            "output_bytes": output_bytes,
            "duration_seconds": round(now - started, 3),
            "completed_at": now,
        }
        if error is not None:
            event["error"] = error
        get_runtime().record_completion(process_id, event, deliver_to=self.completion_queue)

    def poll(self, process_id: str) -> dict[str, Any] | None:
        with self._lock:
            running = self._running.get(process_id)
        if running is not None:
            return {
                "process_id": process_id,
                "status": "running",
                "pid": running.proc.pid,
                "output_tail": running.tail.text(),
                "elapsed_seconds": round(time.time() - running.started, 3),
            }
        from tools.async_delegation import get_runtime

        row = get_runtime().ledger.get(process_id)
        if row is None:
            return None
        return {
            "process_id": process_id,
            "status": row["state"],
            "delivery_state": row["delivery_state"],
            **(row["event"] or {}),
        }

    def kill(self, process_id: str) -> bool:
        with self._lock:
            running = self._running.get(process_id)
        if running is None:
            return False
        running.kill_requested = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(running.proc.pid, signal.SIGTERM)
        return True

    def list_running(self) -> list[dict[str, Any]]:
        with self._lock:
            items = list(self._running.values())
        return [
            {
                "process_id": r.process_id,
                "pid": r.proc.pid,
                "command": r.command,
                "elapsed_seconds": round(time.time() - r.started, 3),
            }
            for r in items
        ]


process_registry = ProcessRegistry()
