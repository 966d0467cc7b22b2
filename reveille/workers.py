"""`reveille serve --workers N`: a supervisor process and N worker servers on the same ports.

With ``workers > 1`` the `reveille serve` process only supervises. It resolves the ports
first: it binds the API port (a configured 0 becomes one concrete free port) and the web
UI port with SO_REUSEPORT and keeps those sockets bound but never listening, so no other
program takes the ports while workers restart and the kernel never hands it a connection.
Then it starts N workers (``python -P -m reveille.cli serve``: never
importing from the current directory, with the concrete ports and the
hidden ``--worker-*`` flags), each a whole `reveille serve` over the same store and state
directory that binds both ports with ``reuse_port``; the kernel spreads connections between
them. Each worker reports on a pipe once it listens; the supervisor then prints the startup
banner once. A worker that dies unexpectedly is started again after a short backoff (the
ledger's dead-peer recovery already takes over its work). SIGTERM or SIGINT: SIGTERM to
every worker, a grace period, SIGKILL for any still running, exit 0.

A worker asks the kernel for SIGTERM when its supervisor dies (Linux ``PR_SET_PDEATHSIG``),
so a killed supervisor leaves no servers behind on its ports.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import functools
import json
import logging
import os
import secrets
import signal
import socket
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict, cast

from reveille import log_format
from reveille.banner import startup_banner
from reveille.settings import Settings

if TYPE_CHECKING:
    from reveille.app import App

__all__ = ["Supervisor", "WorkerRole", "add_worker_arguments", "reserve_port", "supervise"]

logger = logging.getLogger("reveille.workers")


class WorkerReport(TypedDict):
    """What a worker tells its supervisor once it listens: what the banner needs."""

    pid: int
    port: int
    model: str
    restored: int
    webui_url: str | None


_PR_SET_PDEATHSIG = 1
SERVER_SECRET_ENV = "REVEILLE_WORKER_SECRET"
# The checkout that holds the `reveille` package this process imported, when it runs from
# one; an installed package (site-packages) is on the workers' path already, and putting
# site-packages before the standard library would let a backport shadow it.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CODE_ROOT = _ROOT if os.path.isfile(os.path.join(_ROOT, "pyproject.toml")) else ""


def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    """The hidden flags the supervisor starts a worker with."""
    parser.add_argument("--worker-index", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--worker-ready-fd", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--supervisor-pid", type=int, help=argparse.SUPPRESS)


@dataclass(frozen=True)
class WorkerRole:
    """This process is worker ``index`` of the supervisor ``supervisor_pid``: it binds with
    SO_REUSEPORT and reports on ``ready_fd`` once it listens instead of printing a banner."""

    index: int
    ready_fd: int
    supervisor_pid: int
    secret: str | None = None
    """What every worker presents to the others: its self-POSTs (wake-ups) land on any
    worker of the shared port, which must take them as its own (``SERVER_SECRET_ENV``)."""

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> WorkerRole | None:
        fd = getattr(args, "worker_ready_fd", None)
        if fd is None:
            return None
        # From the environment, never argv (which every user of the host can read).
        secret = os.environ.pop(SERVER_SECRET_ENV, None)
        return cls(
            int(getattr(args, "worker_index", 0) or 0), fd, int(args.supervisor_pid or 0), secret
        )

    def argv(self) -> list[str]:
        return [
            "--worker-index", str(self.index),
            "--worker-ready-fd", str(self.ready_fd),
            "--supervisor-pid", str(self.supervisor_pid),
        ]  # fmt: skip

    def enter(self) -> None:
        """Before serving: die with the supervisor, keep the pipe from this process's own
        children, and name the worker in every log line."""
        _die_with_parent()
        if os.getppid() != self.supervisor_pid:
            raise RuntimeError(f"worker {self.index}: its supervisor has already exited")
        os.set_inheritable(self.ready_fd, False)
        log_format.tag_worker(self.index)

    def report_ready(self, app: App) -> None:
        """Tells the supervisor what the banner needs, once this worker listens."""
        webui = app.webui
        report: WorkerReport = {
            "pid": os.getpid(),
            "port": app.adapter.port,
            "model": app.provider.name,
            "restored": app.restored,
            "webui_url": str(webui.url) if webui is not None else None,
        }
        try:
            os.write(self.ready_fd, json.dumps(report).encode())
        finally:
            os.close(self.ready_fd)
        logger.info("serving; supervisor pid %d told", self.supervisor_pid)


def _die_with_parent() -> None:
    """SIGTERM to this process when the process that started it exits (Linux only)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` with SO_REUSEPORT, never listening: it fixes a port
    0 to one concrete port and holds it for the workers (who bind it the same way) without
    ever being handed a connection."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except BaseException:
        sock.close()
        raise
    return sock


def supervise(settings: Settings, *, config: str | None = None, verbose: bool = False) -> int:
    """Run ``settings.workers`` workers on the same ports until SIGINT/SIGTERM; the exit
    status (0 after a signal; a worker's own status when one fails to start)."""
    api = reserve_port(settings.host, settings.port)
    with contextlib.ExitStack() as stack:
        stack.callback(api.close)
        webui_port = 0
        if settings.webui_port:
            webui = reserve_port(settings.host, settings.webui_port)
            stack.callback(webui.close)
            webui_port = int(webui.getsockname()[1])
        supervisor = Supervisor(
            settings,
            api_port=int(api.getsockname()[1]),
            webui_port=webui_port,
            config=config,
            verbose=verbose,
        )
        return asyncio.run(supervisor.run())


class Supervisor:
    """Starts ``settings.workers`` workers, restarts the ones that die, stops them all."""

    def __init__(
        self,
        settings: Settings,
        *,
        api_port: int,
        webui_port: int,
        config: str | None = None,
        verbose: bool = False,
        grace_seconds: float = 20.0,
        ready_timeout_seconds: float = 120.0,
        min_backoff_seconds: float = 0.5,
        max_backoff_seconds: float = 30.0,
        stable_seconds: float = 30.0,
    ) -> None:
        self.settings = settings
        self.api_port = api_port
        self.webui_port = webui_port
        self.config = config
        self.verbose = verbose
        self.grace_seconds = grace_seconds
        self.ready_timeout_seconds = ready_timeout_seconds
        self.min_backoff_seconds = min_backoff_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self.stable_seconds = stable_seconds
        self.procs: dict[int, asyncio.subprocess.Process] = {}
        self.secret = secrets.token_urlsafe(32)
        self._stopping: asyncio.Event | None = None

    @property
    def stopping(self) -> asyncio.Event:
        assert self._stopping is not None, "the supervisor is not running"
        return self._stopping

    async def run(self) -> int:
        self._stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stopping.set)
        try:
            return await self._run()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    async def _run(self) -> int:
        count = self.settings.workers
        started = [await self._spawn(index) for index in range(count)]
        code = await self._first_start([ready for _, ready in started])
        keepers = [
            asyncio.create_task(self._keep(index, proc)) for index, (proc, _) in enumerate(started)
        ]
        if code is None:
            await self.stopping.wait()
            code = 0
        await self._stop_all(keepers)
        logger.info("all %d workers stopped", count)
        return code

    async def _first_start(self, ready: list[asyncio.Task[WorkerReport | None]]) -> int | None:
        """Waits until every worker listens and prints the banner: None; or the exit status
        when a worker failed to start, it took too long, or a signal came first."""
        stop = asyncio.create_task(self.stopping.wait())
        waiting = asyncio.gather(*ready)
        either: set[asyncio.Future[Any]] = {stop, waiting}
        done, _ = await asyncio.wait(
            either, timeout=self.ready_timeout_seconds, return_when=asyncio.FIRST_COMPLETED
        )
        stop.cancel()
        if waiting not in done:
            waiting.cancel()
            if self.stopping.is_set():
                return 0
            logger.error("the workers did not start within %.0f s", self.ready_timeout_seconds)
            return 1
        reports = waiting.result()
        for index, report in enumerate(reports):
            if report is None:
                proc = self.procs[index]
                status = await proc.wait()
                logger.error(
                    "worker %d (pid %d) %s before it served", index, proc.pid, _ended(status)
                )
                return status if status > 0 else 1
        first = reports[0]
        assert first is not None
        banner = startup_banner(
            self.settings,
            port=self.api_port,
            model=str(first["model"]),
            restored=max(int(r["restored"]) for r in reports if r is not None),
            webui_url=first["webui_url"],
            workers=len(reports),
        )
        logger.info("%s", banner)
        pids = ", ".join(str(r["pid"]) for r in reports if r is not None)
        logger.info("supervisor pid %d; worker pids %s", os.getpid(), pids)
        return None

    async def _spawn(self, index: int) -> tuple[asyncio.subprocess.Process, asyncio.Task[Any]]:
        """Worker ``index`` started; with the task that reads its readiness report (None
        when it exited before reporting)."""
        read_fd, write_fd = os.pipe()
        role = WorkerRole(index, write_fd, os.getpid())
        # -P: `python -m` would put the current directory first on sys.path, so a
        # `gateway.py` (or `reveille.py`) in the directory the operator started from would
        # be imported by every worker instead of Reveille's own modules.
        argv = [sys.executable, "-P", "-m", "reveille.cli"]
        argv += [*(["-v"] if self.verbose else []), "serve"]
        argv += ["--host", self.settings.host, "--port", str(self.api_port), *role.argv()]
        if self.config:
            argv += ["--config", self.config]
        env = {
            **os.environ,
            # ...but they import the code this supervisor runs, also from a checkout that
            # was never installed (started there with `python -m reveille.cli`).
            "PYTHONPATH": os.pathsep.join(
                p for p in (_CODE_ROOT, os.environ.get("PYTHONPATH", "")) if p
            ),
            "REVEILLE_WEBUI_PORT": str(self.webui_port),
            SERVER_SECRET_ENV: self.secret,
        }
        try:
            proc = await asyncio.create_subprocess_exec(*argv, env=env, pass_fds=(write_fd,))
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        self.procs[index] = proc
        return proc, asyncio.create_task(_read_report(read_fd))

    async def _keep(self, index: int, proc: asyncio.subprocess.Process) -> None:
        """Restarts worker ``index`` whenever it dies, until the supervisor stops; a worker
        that keeps dying soon after its start waits longer each time."""
        loop = asyncio.get_running_loop()
        backoff = self.min_backoff_seconds
        started = loop.time()
        while True:
            status = await proc.wait()
            if self.stopping.is_set():
                return
            lived = loop.time() - started
            if lived >= self.stable_seconds:
                backoff = self.min_backoff_seconds
            logger.warning(
                "worker %d (pid %d) %s after %.1f s; starting it again in %.1f s",
                index, proc.pid, _ended(status), lived, backoff,
            )  # fmt: skip
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), backoff)
            if self.stopping.is_set():
                return
            backoff = min(backoff * 2, self.max_backoff_seconds)
            started = loop.time()
            proc, ready = await self._spawn(index)
            if self.stopping.is_set():
                _signal(proc, signal.SIGTERM)
            ready.add_done_callback(functools.partial(_announce, index, proc.pid))

    async def _stop_all(self, keepers: list[asyncio.Task[None]]) -> None:
        """SIGTERM to every worker; SIGKILL to those still running after the grace period."""
        self.stopping.set()
        for proc in self.procs.values():
            _signal(proc, signal.SIGTERM)
        done, pending = await asyncio.wait(keepers, timeout=self.grace_seconds)
        if pending:
            for index, proc in self.procs.items():
                if proc.returncode is None:
                    logger.warning(
                        "worker %d (pid %d) ignored SIGTERM: killing it", index, proc.pid
                    )
                    _signal(proc, signal.SIGKILL)
            await asyncio.wait(pending)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                logger.error("watching a worker failed", exc_info=task.exception())


def _announce(index: int, pid: int, ready: asyncio.Task[WorkerReport | None]) -> None:
    if not ready.cancelled() and ready.exception() is None and ready.result() is not None:
        logger.info("worker %d started again: pid %d", index, pid)


def _signal(proc: asyncio.subprocess.Process, sig: int) -> None:
    """``sig`` to a worker not known to have exited. ``os.kill``, not ``send_signal``:
    Popen's polls first and may reap the worker under asyncio's child watcher, which then
    reports it with a made-up status 255."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)


def _ended(status: int) -> str:
    if status < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-status).name}"
        return f"was killed by signal {-status}"
    return f"exited with status {status}"


async def _read_report(fd: int) -> WorkerReport | None:
    """The worker's readiness report: everything written to the pipe until it closed; None
    when nothing was (the worker exited first)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    pipe = os.fdopen(fd, "rb", buffering=0)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    try:
        data = await reader.read()
    finally:
        transport.close()
    if not data:
        return None
    # Written by our own worker (``report_ready``), from this very module.
    return cast(WorkerReport, json.loads(data))
