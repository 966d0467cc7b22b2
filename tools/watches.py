"""The watches of this server: each a running ledger row, followed by a thread that spends
no model tokens until the watch fires.

A watch's row (kind ``WATCH_KIND``, state running, its ``WatchSpec`` in ``request``) is
written before anything is watched, so every server sharing the store sees it, lists it and
can cancel it (``reveille background cancel ID`` too). A firing is a row of its own
(``WATCH_FIRE_KIND``, id ``<watch>.<n>``, a ``SCHEDULED_WAKEUP`` event due at once): the
ledger delivers it like a reminder, and its id makes a firing written twice (a crash between
the write and the count) one row. How often a watch fired, and when last, is read back from
those rows, so a restart keeps the count and the cooldown.

The watch ends with its row's completion, delivered as a wake-up too: ``expired`` when its
lifetime ran out, ``ended`` when its process exited unmatched; after its last allowed firing
the row completes with nothing to deliver. A server that dies leaves its running watch rows
to the ledger's recovery, which hands them to a survivor's (or the restarted server's)
``adopt``: an interval-command watch goes on from its count; an output watch goes on reading
its process's output from where the file is then, when that server follows the process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.markers import defang
from delivery.errors import LedgerUnavailable
from delivery.events import SCHEDULED_WAKEUP, WATCH_FIRE_KIND, WATCH_KIND
from delivery.ledger import Ledger
from delivery.rows import LedgerRow
from delivery.states import State
from tools.background_processes import PROCESS_KIND, ProcessRegistry
from tools.delegation_runtime import DelegationRuntime, get_runtime
from tools.watch_rules import (
    COMMAND,
    LineScanner,
    WatchError,
    WatchOrigin,
    WatchSpec,
    WatchState,
    compile_guarded,
    fire_id,
)

log = logging.getLogger(__name__)

OUTPUT_POLL_SECONDS = 0.5
"""How often an output watch reads what its process wrote since (a file read, no model)."""
READ_CHUNK = 256 * 1024
READ_PER_PASS = 16 * READ_CHUNK
"""At most this much output is read by one pass of a watch on a running process: a flood is
read in turns (the next pass comes at once), so no pass holds the watch's lock for long."""
MATCHED_TAIL_BYTES = 2048
SHELL_OFF_ERROR = "the shell tool is off on this server, so the watch's command cannot run"


@dataclass(slots=True)
class _Runner:
    watch_id: str
    spec: WatchSpec
    origin: WatchOrigin
    state: WatchState
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    process_gone: bool = False
    offset: int | None = None  # where an output watch reads on; None: not started
    behind: bool = False  # the last pass stopped at READ_PER_PASS: the next one comes at once
    scanner: LineScanner = field(default_factory=LineScanner)
    matched: list[str] = field(default_factory=list)


def _origin_of(row: LedgerRow) -> WatchOrigin:
    return WatchOrigin(row.session_key, row.origin_session_id, row.origin_ui_session_id)


class WatchManager:
    """Starts, follows, adopts and ends this server's watches."""

    def __init__(
        self,
        *,
        runtime: Callable[[], DelegationRuntime] = get_runtime,
        processes: Callable[[], ProcessRegistry] | None = None,
        clock: Callable[[], float] = time.time,
        poll_seconds: float = OUTPUT_POLL_SECONDS,
    ) -> None:
        self._runtime = runtime
        self._processes = processes or _shared_registry
        self._clock = clock
        self._poll = poll_seconds
        self._runners: dict[str, _Runner] = {}
        self._lock = threading.Lock()
        self.shell_enabled = False
        self.workdir: str | None = None

    # -- wiring ---------------------------------------------------------------------------------

    def attach(
        self,
        ledger: Ledger,
        *,
        shell_enabled: bool,
        workdir: str | None = None,
    ) -> None:
        """Adopt the watches of dead servers through ``ledger``'s recovery; run interval
        commands only when ``shell_enabled`` (in ``workdir``)."""
        self.shell_enabled = shell_enabled
        self.workdir = workdir
        ledger.set_adopter(WATCH_KIND, self.adopt)
        self._processes().add_exit_listener(self._process_exited)

    def detach(self) -> None:
        """Stop following (the server closes): the rows stay running for a survivor."""
        self._processes().remove_exit_listener(self._process_exited)
        with self._lock:
            runners = list(self._runners.values())
            self._runners.clear()
        for runner in runners:
            runner.stop.set()

    # -- the tool's actions (blocking store work: call in a thread) ----------------------------

    def create(self, watch_id: str, spec: WatchSpec, origin: WatchOrigin) -> None:
        """Write the watch's row, then follow it here."""
        if spec.kind == COMMAND and not self.shell_enabled:
            raise WatchError(SHELL_OFF_ERROR)
        if spec.kind != COMMAND:
            process = self._runtime().ledger.get(spec.process_id or "")
            if process is None or process.kind != PROCESS_KIND:
                raise WatchError(f"no background process {spec.process_id}")
            if process.state != State.RUNNING.value:
                raise WatchError(f"process {spec.process_id} has already ended ({process.state})")
        self._runtime().ledger.create(
            watch_id,
            kind=WATCH_KIND,
            state=State.RUNNING.value,
            session_key=origin.session_key,
            origin_session_id=origin.origin_session_id,
            origin_ui_session_id=origin.origin_ui_session_id,
            goal=f"watch: {spec.describe()}",
            # Shaped as the watch's own event, so the notice of a cancel restates it.
            request={
                **spec.as_request(),
                "type": SCHEDULED_WAKEUP,
                "watch_id": watch_id,
                "watch_event": "cancelled",
                "note": spec.note,
                "session_key": origin.session_key,
                "origin_session_id": origin.origin_session_id,
                "origin_ui_session_id": origin.origin_ui_session_id,
                "dispatched_at": spec.created_at,
            },
        )
        self._follow(_Runner(watch_id, spec, origin, WatchState(), offset=None))

    def adopt(self, row: LedgerRow) -> None:
        """Follow the watch of ``row``, whose server died (the ledger made this one its
        owner); an output watch reads on from where its process's output is now."""
        try:
            spec = WatchSpec.from_request(row.request)
        except (WatchError, TypeError):
            log.warning("watch %s has no readable spec; ending it", row.id)
            spec = WatchSpec("(unreadable watch)", COMMAND, row.created_at, 0.0, 0.0, 1)
        runner = _Runner(row.id, spec, _origin_of(row), self._fired_so_far(row.id))
        runner.offset = -1  # an adopted output watch starts at the file's end
        log.info("adopted watch %s (%d firing(s) so far)", row.id, runner.state.fires)
        self._follow(runner)

    def running_here(self) -> list[str]:
        with self._lock:
            return sorted(self._runners)

    # -- following ------------------------------------------------------------------------------

    def _follow(self, runner: _Runner) -> None:
        with self._lock:
            self._runners[runner.watch_id] = runner
        self._runtime().watch(runner.watch_id, runner.stop.set)  # a cancel stops it here
        target = self._run_command if runner.spec.kind == COMMAND else self._run_output
        threading.Thread(
            target=self._guarded,
            args=(target, runner),
            name=f"watch-{runner.watch_id}",
            daemon=True,
        ).start()

    def _guarded(self, target: Callable[[_Runner], None], runner: _Runner) -> None:
        try:
            target(runner)
        except LedgerUnavailable as exc:
            # The store is gone (the server stops): the row stays running for a survivor.
            log.warning("watch %s stopped: %s", runner.watch_id, exc)
        except Exception as exc:
            log.exception("watch %s failed", runner.watch_id)
            self._end(runner, "ended", error=f"the watch failed: {exc}", status="failed")
        finally:
            with self._lock:
                if self._runners.get(runner.watch_id) is runner:
                    del self._runners[runner.watch_id]
            with contextlib.suppress(Exception):
                self._runtime().unwatch(runner.watch_id)

    def _wait(self, runner: _Runner, seconds: float) -> bool:
        """Sleep up to ``seconds`` (never past the expiry); False once stopped."""
        left = runner.spec.expires_at - self._clock()
        return not runner.stop.wait(max(0.0, min(seconds, left)))

    def _expired(self, runner: _Runner) -> bool:
        if self._clock() < runner.spec.expires_at:
            return False
        self._end(runner, "expired")
        return True

    def _run_command(self, runner: _Runner) -> None:
        spec = runner.spec
        if not self.shell_enabled:
            self._end(runner, "ended", error=SHELL_OFF_ERROR, status="failed")
            return
        assert spec.command is not None and spec.interval_seconds is not None
        while not self._expired(runner):
            if runner.state.may_fire(spec, self._clock()):
                exit_code, tail = self._run_once(spec.command, spec.timeout_seconds or 30.0)
                if runner.stop.is_set():
                    return
                if exit_code == 0:
                    said = f"\n{tail}" if tail.strip() else ""
                    if self._fire(runner, f"`{spec.command}` exited 0{said}"):
                        return
            if not self._wait(runner, spec.interval_seconds):
                return

    def _run_once(self, command: str, timeout: float) -> tuple[int | None, str]:
        """Run ``command`` once, its whole group killed after ``timeout``: its exit code
        (None when it timed out) and the end of its output."""
        with tempfile.TemporaryFile() as out:
            proc = subprocess.Popen(
                command,
                shell=True,
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                code: int | None = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                code = None
            size = out.seek(0, os.SEEK_END)
            out.seek(max(0, size - MATCHED_TAIL_BYTES))
            return code, out.read().decode("utf-8", errors="replace")

    def _run_output(self, runner: _Runner) -> None:
        spec = runner.spec
        pattern = compile_guarded(spec.pattern)
        while not self._expired(runner):
            with runner.lock:
                followed = self._scan(runner, pattern)
                gone, matched = runner.process_gone, list(runner.matched)
                runner.matched.clear()
            for line in matched:
                if runner.state.may_fire(spec, self._clock()) and self._fire(runner, line):
                    return
            # A process this server does not follow (yet: another may be adopting it) is
            # looked up in the store; one that has ended takes its watch with it.
            if not gone and not followed and (tail := self._ended_output(spec)) is not None:
                if runner.offset is None:
                    # It ended before this watch read a byte: what it wrote is in its result.
                    runner.offset, runner.process_gone = 0, True
                    lines = runner.scanner.feed(tail.encode()) + runner.scanner.finish()
                    runner.matched += [line for line in lines if pattern.search(line)]
                    continue
                gone = True
            if gone:
                self._end(runner, "ended")
                return
            # Woken early by its process's exit (the listener), one more pass reads the rest;
            # otherwise it was cancelled, or this server stops.
            if not self._wait(runner, 0.0 if runner.behind else self._poll) and (
                not runner.process_gone
            ):
                return

    def _ended_output(self, spec: WatchSpec) -> str | None:
        """The output tail of the watched process once it has ended, else None."""
        row = self._runtime().ledger.get(spec.process_id or "")
        if row is not None and row.state == State.RUNNING.value:
            return None
        tail = (row.event or {}).get("output_tail") if row is not None else None
        return tail if isinstance(tail, str) else ""

    def _scan(self, runner: _Runner, pattern: Any, path: Path | None = None) -> bool:
        """Read what the process wrote since the last pass and keep the lines that match
        (under ``runner.lock``); False when this server does not follow the process. The
        first read of an adopted watch starts at the end of the output. Only what was
        appended is read, at most ``READ_PER_PASS`` while the process runs (all of it once it
        has ended: its file goes next); a file that has not grown is not even opened."""
        path = path or self._processes().output_file(runner.spec.process_id or "")
        if path is None:
            return runner.process_gone
        try:
            read = runner.offset
            if read is not None and read >= 0 and not runner.process_gone:
                grown = os.stat(path).st_size > read
            else:
                grown = True
            if not grown:
                runner.behind = False
                return True  # nothing appended since the last pass
            with open(path, "rb") as fh:
                if runner.offset is None or runner.offset < 0:
                    runner.offset = 0 if runner.offset is None else fh.seek(0, os.SEEK_END)
                fh.seek(runner.offset)
                budget = None if runner.process_gone else READ_PER_PASS
                runner.behind = False
                while chunk := fh.read(READ_CHUNK if budget is None else min(READ_CHUNK, budget)):
                    runner.offset += len(chunk)
                    lines = runner.scanner.feed(chunk)
                    runner.matched += [line for line in lines if pattern.search(line)]
                    if budget is not None:
                        budget -= len(chunk)
                        if budget <= 0:
                            runner.behind = True
                            break
        except FileNotFoundError:
            return False
        if runner.process_gone:
            runner.matched += [line for line in runner.scanner.finish() if pattern.search(line)]
        return True

    def _process_exited(self, process_id: str, output: Path) -> None:
        """A followed process ended; its output file is still there: read the rest now."""
        with self._lock:
            runners = [r for r in self._runners.values() if r.spec.process_id == process_id]
        for runner in runners:
            with runner.lock:
                if runner.offset is None:
                    runner.offset = 0
                runner.process_gone = True
                with contextlib.suppress(WatchError, OSError):
                    self._scan(runner, compile_guarded(runner.spec.pattern), output)
            runner.stop.set()

    # -- firing and ending ---------------------------------------------------------------------

    def _fired_so_far(self, watch_id: str) -> WatchState:
        ledger = self._runtime().ledger
        state = WatchState()
        while (row := ledger.get(fire_id(watch_id, state.fires + 1))) is not None:
            state.fires += 1
            state.last_fired_at = row.created_at
        return state

    def _event(self, runner: _Runner, row_id: str, watch_event: str) -> dict[str, Any]:
        now = self._clock()
        return {
            "type": SCHEDULED_WAKEUP,
            "delivery_id": row_id,
            "status": "completed",
            "note": runner.spec.note,
            "watch_id": runner.watch_id,
            "watch_event": watch_event,
            "fires": runner.state.fires,
            "session_key": runner.origin.session_key,
            "origin_session_id": runner.origin.origin_session_id,
            "origin_ui_session_id": runner.origin.origin_ui_session_id,
            "dispatched_at": runner.spec.created_at,
            "due_at": now,
            "completed_at": now,
        }

    def _fire(self, runner: _Runner, matched: str) -> bool:
        """Write the next firing (once, whoever writes it); True when the watch is done."""
        ledger = self._runtime().ledger
        watch = ledger.get(runner.watch_id)
        if watch is None or watch.state != State.RUNNING.value:
            return True  # cancelled (or ended) meanwhile: it fires no more
        number = runner.state.fires + 1
        row_id = fire_id(runner.watch_id, number)
        runner.state.fires = number
        runner.state.last_fired_at = self._clock()
        event = self._event(runner, row_id, "fired")
        event["matched"] = defang(matched)
        try:
            ledger.schedule(
                row_id,
                kind=WATCH_FIRE_KIND,
                event=event,
                not_before=event["due_at"],
                session_key=runner.origin.session_key,
                origin_session_id=runner.origin.origin_session_id,
                origin_ui_session_id=runner.origin.origin_ui_session_id,
                goal=f"watch {runner.watch_id} fired",
            )
        except LedgerUnavailable:
            raise
        except Exception:
            if ledger.get(row_id) is None:
                raise
            log.info("firing %s was written before", row_id)  # one row per firing
        log.info("watch %s fired (%d of %d)", runner.watch_id, number, runner.spec.max_fires)
        if runner.state.done(runner.spec):
            # Its last firing said all there is: the row ends with nothing more to deliver.
            ledger.drop(runner.watch_id, f"fired {number} time(s), as many as allowed")
            self._end(runner, "fired")
            return True
        return False

    def _end(
        self, runner: _Runner, watch_event: str, *, error: str | None = None, status: str = ""
    ) -> None:
        event = self._event(runner, runner.watch_id, watch_event)
        event["status"] = status or State.COMPLETED.value
        if error is not None:
            event["error"] = error
        log.info("watch %s ends: %s", runner.watch_id, watch_event)
        runner.stop.set()
        self._runtime().record_completion(runner.watch_id, event)


def _shared_registry() -> ProcessRegistry:
    from tools.process_registry import process_registry

    return process_registry


watch_manager = WatchManager()
"""This process's watches (wired by the composition root: ``watch_manager.attach``)."""

__all__ = ["WatchManager", "WatchOrigin", "watch_manager"]
