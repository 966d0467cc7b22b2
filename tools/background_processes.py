"""Background shell processes whose completions are recorded and delivered like delegations.

``ProcessRegistry.spawn`` runs a real subprocess in the background. Its ledger row is
written before the process starts, and its completion (exit code, duration, a bounded tail
of the output) is written to the ledger before it is queued, so it survives a restart. The
ledger is the one of the process-wide delegation runtime (``get_runtime``, or whatever
getter the registry was given).

A command outlives the server that started it (a SIGKILL, a restart), so it is run in a way
that a later server can adopt: a small wrapper (``python -I -S -c``, its own session
leader) runs the command with ``/bin/sh -c``, its output going to a file, and writes the
command's exit status to a file (temp + rename) once it ends. Both live in
``<state dir>/processes/<process_id>/`` (0700, files 0600) beside ``wrapper``, the wrapper's
process identity (pid and start time, safe against pid reuse). ``attach(ledger)`` makes the
registry the ledger's adopter of process rows whose owner died: it delivers the recorded
exit status and output tail, waits (on a pidfd, no polling) for a wrapper still running, or,
when neither can be found, says so. The ledger's compare-and-sets make that one completion
per process, whichever server reports it.

``process_registry`` is this process's registry; it queues on the shared completion queue.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import select
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from delivery import traces
from delivery.errors import LedgerUnavailable
from delivery.events import PROCESS_COMPLETION
from delivery.identity import ProcessIdentity
from delivery.ids import new_id
from delivery.ledger import Ledger
from delivery.rows import LedgerRow
from delivery.states import State
from tools.completion_queue import CompletionQueue, WireEvent, shared_completion_queue
from tools.delegation_runtime import (
    PROGRESS_INTERVAL_SECONDS,
    DelegationRuntime,
    default_state_dir,
    get_runtime,
    stamp_response_origin,
)

# The "X as X" names are re-exported: this module offered them before its files moved out.
from tools.process_files import EXIT_FILE as EXIT_FILE
from tools.process_files import (
    OUTPUT_FILE,
    PROCESSES_DIR,
    WRAPPER_FILE,
    alive,
    read_exit_status,
    read_output_tail,
    read_wrapper_identity,
    start_wrapper,
    stop_group,
)
from tools.process_files import OUTPUT_TAIL_BYTES as OUTPUT_TAIL_BYTES
from tools.process_files import _Tail as _Tail

log = logging.getLogger(__name__)

PROGRESS_TAIL_BYTES = 2048  # enough for a last output line
PROCESS_KIND = "process"

NOT_FOUND_ERROR = (
    "The command could not be found after the restart; its exit status was never recorded. "
    "Whether it finished, and how, is unknown."
)
VANISHED_ERROR = (
    "The command's wrapper ended without recording its exit status (it was killed); "
    "how the command ended is unknown."
)

ProcessRequest = dict[str, Any]
"""A process's completion event as far as it is known at spawn (stored with its row)."""
ProcessInfo = dict[str, Any]
"""What ``spawn`` and ``poll`` answer: ``process_id``, ``status``, ``pid``, output ..."""


class _Running:
    """A background process this registry follows: one it started, or one it adopted."""

    def __init__(
        self,
        process_id: str,
        pid: int,
        command: str,
        directory: Path,
        *,
        started: float | None = None,
        proc: subprocess.Popen[bytes] | None = None,
        adopted: bool = False,
    ) -> None:
        self.process_id = process_id
        self.pid = pid
        self.proc = proc
        self.command = command
        self.directory = directory
        self.started = time.time() if started is None else started
        self.adopted = adopted
        self.kill_requested = False

    def output(self) -> tuple[str, int]:
        return read_output_tail(self.directory / OUTPUT_FILE)


class ProcessRegistry:
    """The background processes of this process, and the queue their completions go to."""

    def __init__(
        self,
        completion_queue: CompletionQueue | None = None,
        *,
        runtime: Callable[[], DelegationRuntime] = get_runtime,
        directory: Path | None = None,
    ) -> None:
        self.completion_queue = CompletionQueue() if completion_queue is None else completion_queue
        self._runtime = runtime
        self._directory_given = directory
        self._running: dict[str, _Running] = {}
        self._lock = threading.Lock()
        self._exit_listeners: list[Callable[[str, Path], None]] = []

    # -- where a process's files live -------------------------------------------------------

    @property
    def processes_dir(self) -> Path:
        """Where each process keeps its files (a directory per process id): the one the
        composition root handed over (``attach``), else ``<state dir>/processes`` of
        ``REVEILLE_HOME`` for embedders that wire nothing. Never derived from where the
        ledger lives: with PostgreSQL it lives nowhere on this disk."""
        if self._directory_given is not None:
            return self._directory_given
        return default_state_dir() / PROCESSES_DIR

    def _directory(self, process_id: str) -> Path:
        return self.processes_dir / process_id

    def output_file(self, process_id: str) -> Path | None:
        """The output file of ``process_id`` while this registry follows it, else None."""
        with self._lock:
            running = self._running.get(process_id)
        return None if running is None else running.directory / OUTPUT_FILE

    def add_exit_listener(self, fn: Callable[[str, Path], None]) -> None:
        """Call ``fn(process_id, output_file)`` when a followed process has ended, while its
        output file is still there (before its completion is recorded and the files go)."""
        self._exit_listeners.append(fn)

    def remove_exit_listener(self, fn: Callable[[str, Path], None]) -> None:
        with contextlib.suppress(ValueError):
            self._exit_listeners.remove(fn)

    # -- starting -----------------------------------------------------------------------------

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
        if traceparent := traces.turn_traceparent():
            request[traces.TRACEPARENT] = traceparent  # stored: the wake-up's span links to it
        stamp_response_origin(request)
        ledger.create(
            process_id,
            kind=PROCESS_KIND,
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
        directory = self._directory(process_id)
        started = time.time()
        try:
            proc = start_wrapper(directory, command, cwd=cwd, env=env)
        except OSError as exc:
            self._finish(
                process_id,
                request,
                exit_code=None,
                output="",
                error=str(exc),
                started=started,
                killed=False,
                directory=directory,
            )
            raise
        running = _Running(process_id, proc.pid, command, directory, started=started, proc=proc)
        with self._lock:
            self._running[process_id] = running
        log.info(
            "background process %s started: pid %d, session %s, command %r",
            process_id,
            proc.pid,
            origin_ui_session_id or origin_session_id or session_key,
            command[:80],  # repr: one line whatever it holds; the ledger keeps it whole
        )
        self._runtime().watch(process_id, functools.partial(self.kill, process_id))
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
        assert running.proc is not None
        timer = None
        if timeout:
            timer = threading.Timer(timeout, self.kill, args=(running.process_id,))
            timer.daemon = True
            timer.start()
        code = self._wait_reporting(running, running.proc)
        if timer:
            timer.cancel()
        self._conclude(running, request, wrapper_code=code)

    def _wait_reporting(self, running: _Running, proc: subprocess.Popen[bytes]) -> int:
        """Wait for the wrapper, reporting the command's last output line as its progress
        (at most once per ``PROGRESS_INTERVAL_SECONDS``, and only when the output grew)."""
        seen = 0
        while True:
            try:
                return proc.wait(timeout=PROGRESS_INTERVAL_SECONDS)
            except subprocess.TimeoutExpired:
                pass
            tail, size = read_output_tail(running.directory / OUTPUT_FILE, PROGRESS_TAIL_BYTES)
            if size != seen or not seen:
                seen = size or -1
                with contextlib.suppress(Exception):  # a report never stops the watch
                    self._runtime().progress(
                        running.process_id, step="running the command", line=tail
                    )

    # -- adopting the processes of a server that died ------------------------------------------

    def attach(self, ledger: Ledger, *, directory: Path | None = None) -> None:
        """Keep process files in ``directory`` (when given), and adopt, through ``ledger``'s
        recovery, the running process rows of dead owners (whose files are there too)."""
        if directory is not None:
            self._directory_given = directory
        ledger.set_adopter(PROCESS_KIND, self.adopt)
        self._runtime().set_orphan_stopper(PROCESS_KIND, self.kill_orphan)

    def detach(self) -> None:
        """Forget the directory ``attach`` was handed (its server closed)."""
        self._directory_given = None

    def adopt(self, row: LedgerRow) -> None:
        """Follow the process of ``row`` (now owned by this process) to its real outcome.

        Recorded exit status: delivered now. Wrapper still running: waited for on a pidfd in
        a thread, then delivered. Neither: reported unknown, in words that say so.
        """
        process_id = row.id
        with self._lock:
            if process_id in self._running:
                return
        request: ProcessRequest = dict(row.request or {})
        request.setdefault("type", PROCESS_COMPLETION)
        request["delivery_id"] = request["process_id"] = process_id
        command = str(request.get("command") or row.goal or "")
        directory = self._directory(process_id)
        started = row.started_at or row.created_at or time.time()
        ident = read_wrapper_identity(directory)
        pid = ident.pid if ident is not None else 0
        running = _Running(process_id, pid, command, directory, started=started, adopted=True)
        if read_exit_status(directory) is None and alive(ident):
            assert ident is not None
            try:
                fd: int | None = os.pidfd_open(ident.pid)
            except (OSError, AttributeError):
                fd = None  # no pidfd support: a slow check of the identity instead
            if alive(ident):  # the pid may have been reused before it was opened
                with self._lock:
                    self._running[process_id] = running
                self._runtime().watch(process_id, functools.partial(self.kill, process_id))
                log.info("adopted background process %s (pid %s): waiting", process_id, pid)
                threading.Thread(
                    target=self._wait_adopted,
                    args=(running, request, ident, fd),
                    name=f"proc-{process_id}",
                    daemon=True,
                ).start()
                return
            if fd is not None:
                os.close(fd)
        log.info("adopted background process %s: it has ended", process_id)
        self._conclude(running, request, wrapper_code=None)

    def _wait_adopted(
        self, running: _Running, request: ProcessRequest, ident: ProcessIdentity, fd: int | None
    ) -> None:
        try:
            if fd is not None:
                select.select([fd], [], [])
            else:  # pragma: no cover - kernels without pidfd_open
                while alive(ident):
                    time.sleep(1.0)
        finally:
            if fd is not None:
                os.close(fd)
        self._conclude(running, request, wrapper_code=None)

    # -- finishing ----------------------------------------------------------------------------

    def _conclude(
        self, running: _Running, request: ProcessRequest, *, wrapper_code: int | None
    ) -> None:
        """Record what the process's files say: the exit status the wrapper wrote, else the
        wrapper's own (a child of this process), else unknown."""
        with self._lock:
            self._running.pop(running.process_id, None)
        with contextlib.suppress(Exception):
            self._runtime().unwatch(running.process_id)
        for listener in list(self._exit_listeners):
            try:
                listener(running.process_id, running.directory / OUTPUT_FILE)
            except Exception:  # a listener never keeps a completion from being recorded
                log.exception("exit listener of %s failed", running.process_id)
        output, size = running.output()
        recorded = read_exit_status(running.directory)
        error = None
        ended = None
        if recorded is not None:
            code: int | None = recorded[0]
            ended = recorded[1]
        elif wrapper_code is not None:
            code = wrapper_code
        else:
            code = None
            error = VANISHED_ERROR if running.pid and running.adopted else NOT_FOUND_ERROR
            if not os.path.exists(running.directory / WRAPPER_FILE):
                error = NOT_FOUND_ERROR
        extra: dict[str, Any] = {"adopted": True} if running.adopted else {}
        self._finish(
            running.process_id,
            {**request, **extra},
            exit_code=code,
            output=output,
            error=error,
            started=running.started,
            killed=running.kill_requested,
            output_bytes=size,
            ended=ended,
            unknown=code is None and error is not None,
            directory=running.directory,
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
        ended: float | None = None,
        unknown: bool = False,
        directory: Path | None = None,
    ) -> None:
        now = time.time()
        if unknown:
            status = State.UNKNOWN.value
        elif error is not None:
            status = "error"
        elif killed:
            status = "cancelled"
        else:
            status = "completed" if exit_code == 0 else "failed"
        end = now if ended is None else min(ended, now)
        event: WireEvent = {
            **request,
            "status": status,
            "exit_code": exit_code,
            "output_tail": output,
            "output_bytes": output_bytes,
            "duration_seconds": round(max(end - started, 0.0), 3),
            "completed_at": now,
        }
        if error is not None:
            event["error"] = error
        if unknown:
            event["abandoned"] = True
        traces.record_background("process", process_id, request, started, status)
        log.info(
            "background process %s ended: %s, exit code %s, after %.1f s",
            process_id,
            status,
            exit_code,
            event["duration_seconds"],
        )

        def cleanup() -> None:
            # The ledger holds the result now; the files were only its way there.
            if directory is not None:
                shutil.rmtree(directory, ignore_errors=True)

        try:
            self._runtime().record_completion(
                process_id, event, deliver_to=self.completion_queue, on_recorded=cleanup
            )
        except LedgerUnavailable as exc:
            # The server is stopping (or its store is gone): the exit status stays in the
            # process's directory, and the next server adopts it from there.
            log.warning("process %s ended but could not be recorded (%s)", process_id, exc)

    # -- control ------------------------------------------------------------------------------

    def poll(self, process_id: str) -> ProcessInfo | None:
        with self._lock:
            running = self._running.get(process_id)
        if running is not None:
            return {
                "process_id": process_id,
                "status": "running",
                "pid": running.pid,
                "output_tail": running.output()[0],
                "elapsed_seconds": round(time.time() - running.started, 3),
            }
        row = self._runtime().ledger.get(process_id)
        if row is None:
            return None
        return {
            "process_id": process_id,
            "status": row.state,
            "delivery_state": row.delivery_state,
            **(row.event or {}),
        }

    def kill(self, process_id: str) -> bool:
        with self._lock:
            running = self._running.get(process_id)
        if running is None:
            return False
        if running.proc is None:
            ident = read_wrapper_identity(running.directory)
            if ident is None or ident.pid != running.pid or not alive(ident):
                return False  # ended (or its pid is no longer its): nothing to signal
        running.kill_requested = True
        stop_group(running.pid)
        return True

    def kill_orphan(self, process_id: str) -> bool:
        """Stop the command of ``process_id`` whose server died (its row was cancelled
        before anyone adopted it): its wrapper's group, found by the identity on disk."""
        ident = read_wrapper_identity(self._directory(process_id))
        if ident is None or not alive(ident):
            return False  # ended, or not of this host: nothing here to signal
        stop_group(ident.pid)
        log.info("stopped the command of %s, whose server is gone", process_id)
        return True

    def list_running(self) -> list[ProcessInfo]:
        with self._lock:
            items = list(self._running.values())
        return [
            {
                "process_id": r.process_id,
                "pid": r.pid,
                "command": r.command,
                "elapsed_seconds": round(time.time() - r.started, 3),
            }
            for r in items
        ]


process_registry = ProcessRegistry(shared_completion_queue)
"""This process's registry; its ``completion_queue`` is the shared one every consumer drains."""
