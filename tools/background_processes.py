"""Background shell processes whose completions are recorded and delivered like delegations.

``ProcessRegistry.spawn`` runs a real subprocess in the background. Its ledger row is
written before the process starts, and its completion (exit code, duration, a bounded tail
of the output) is written to the ledger before it is queued, so it survives a restart. The
ledger is the one of the process-wide delegation runtime (``get_runtime``, or whatever
getter the registry was given).

``process_registry`` is this process's registry; it queues on the shared completion queue.
"""

from __future__ import annotations

import collections
import contextlib
import io
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any, cast

from delivery.events import PROCESS_COMPLETION
from delivery.ids import new_id
from tools.completion_queue import CompletionEvent, CompletionQueue, shared_completion_queue
from tools.delegation_runtime import DelegationRuntime, get_runtime

OUTPUT_TAIL_BYTES = 16 * 1024

ProcessRequest = dict[str, Any]
"""A process's completion event as far as it is known at spawn (stored with its row)."""
ProcessInfo = dict[str, Any]
"""What ``spawn`` and ``poll`` answer: ``process_id``, ``status``, ``pid``, output ..."""


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
    """The background processes of this process, and the queue their completions go to."""

    def __init__(
        self,
        completion_queue: CompletionQueue | None = None,
        *,
        runtime: Callable[[], DelegationRuntime] = get_runtime,
    ) -> None:
        self.completion_queue = CompletionQueue() if completion_queue is None else completion_queue
        self._runtime = runtime
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
    ) -> ProcessInfo:
        """Start ``command`` in the background; its completion is recorded and, if asked, queued."""
        if not isinstance(command, str) or not command.strip():
            raise ValueError("command must be a non-empty string")
        ledger = self._runtime().ledger
        process_id = new_id("proc_")
        request: ProcessRequest = {
            "type": PROCESS_COMPLETION,
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

    def _watch(self, running: _Running, request: ProcessRequest, timeout: float | None) -> None:
        proc = running.proc
        timer = None
        if timeout:
            timer = threading.Timer(timeout, self.kill, args=(running.process_id,))
            timer.daemon = True
            timer.start()
        # Popen's default buffering makes stdout a BufferedReader, whose read1 returns what
        # is there instead of waiting for a full buffer.
        assert proc.stdout is not None
        stdout = cast(io.BufferedReader, proc.stdout)
        for chunk in iter(lambda: stdout.read1(65536), b""):
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
        request: ProcessRequest,
        *,
        exit_code: int | None,
        output: str,
        error: str | None,
        started: float,
        killed: bool,
        output_bytes: int = 0,
    ) -> None:
        now = time.time()
        if error is not None:
            status = "error"
        elif killed:
            status = "cancelled"
        else:
            status = "completed" if exit_code == 0 else "failed"
        event: CompletionEvent = {
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
        self._runtime().record_completion(process_id, event, deliver_to=self.completion_queue)

    def poll(self, process_id: str) -> ProcessInfo | None:
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
        row = self._runtime().ledger.get(process_id)
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

    def list_running(self) -> list[ProcessInfo]:
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


process_registry = ProcessRegistry(shared_completion_queue)
"""This process's registry; its ``completion_queue`` is the shared one every consumer drains."""
