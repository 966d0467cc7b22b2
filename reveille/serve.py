"""`reveille serve`: the API server and the completion watcher, until SIGINT/SIGTERM.

`reveille serve [--host H] [--port P] [--workers N] [--config FILE]` runs the
OpenAI-compatible API server, the web UI on its own port (``http://127.0.0.1:8787/`` by
default, ``REVEILLE_WEBUI_PORT``) with the embedded SQLite state under ``$REVEILLE_HOME``
(``~/.reveille``), the delivery ledger's re-offer scheduler and the completion watcher,
until SIGINT/SIGTERM. It logs where it listens, which model answers (saying plainly when
that is the offline demo model) and a copy-paste example. With ``--workers N`` (N > 1)
this process supervises N such servers on the same ports instead (``reveille.workers``).
Each server runs on uvloop when it is installed (``reveille.event_loop``,
``REVEILLE_EVENT_LOOP``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

from reveille import collector
from reveille.banner import startup_banner
from reveille.settings import Settings, load_settings

if TYPE_CHECKING:
    from reveille.workers import WorkerRole

__all__ = ["add_serve_parser", "run_serve"]

logger = logging.getLogger("reveille.serve")


def add_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "serve",
        help="run the OpenAI-compatible API server and deliver background results",
        description=(
            "Run the OpenAI-compatible API server (default http://127.0.0.1:8642/v1) with "
            "the completion watcher. Settings come from $REVEILLE_HOME/config.toml (or "
            "--config) and environment variables; API_SERVER_KEY sets the bearer key."
        ),
    )
    parser.add_argument("--host", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on (default 8642; 0: any free)")
    parser.add_argument(
        "--workers",
        metavar="N",
        help="processes serving the same ports over one store (default 1; auto: one per core)",
    )
    parser.add_argument("--config", metavar="FILE", help="settings file (TOML)")
    from reveille.workers import add_worker_arguments

    add_worker_arguments(parser)
    parser.set_defaults(func=run_serve)
    return parser


def run_serve(args: argparse.Namespace) -> int:
    from delivery.errors import LedgerError
    from reveille.event_loop import choose_event_loop
    from reveille.workers import WorkerRole, supervise

    role = WorkerRole.from_args(args)
    settings = load_settings(
        config_file=getattr(args, "config", None),
        host=getattr(args, "host", None),
        port=getattr(args, "port", None),
        # a worker serves; it never starts workers of its own
        workers=1 if role is not None else getattr(args, "workers", None),
    )
    try:
        loop = choose_event_loop()  # refused before any worker starts
        if settings.workers > 1:
            return supervise(
                settings,
                config=getattr(args, "config", None),
                verbose=bool(getattr(args, "verbose", False)),
            )
        if role is not None:
            role.enter()
        logger.debug("event loop: %s", loop.name)
        with asyncio.Runner(loop_factory=loop.factory) as runner:
            runner.run(serve_until_signalled(settings, role=role))
    except ValueError as exc:  # a setting the start refused (SettingsError)
        print(f"reveille serve: {exc}", file=sys.stderr)
        return 2
    except LedgerError as exc:  # the store cannot be reached or used: one line, no traceback
        print(f"reveille serve: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        ports = f"API server port {settings.port}"
        if settings.webui_port:
            ports += f", web UI port {settings.webui_port}"
        print(
            f"reveille serve: cannot listen on {settings.host} ({ports}): {exc}\n"
            "  Is another reveille serve running? Choose other ports with REVEILLE_PORT and "
            "REVEILLE_WEBUI_PORT (0 turns the web UI off).",
            file=sys.stderr,
        )
        return 1
    except RuntimeError as exc:
        print(f"reveille serve: {exc}", file=sys.stderr)
        return 1
    return 0


async def serve_until_signalled(settings: Settings, *, role: WorkerRole | None = None) -> None:
    """``reveille.app.serve`` until SIGINT or SIGTERM; then everything closes in reverse.
    As a worker (``role``) it shares its ports and reports to its supervisor, which prints
    the banner, instead of printing it."""
    from reveille.app import serve

    stopping = asyncio.Event()
    received: list[str] = []

    def on_signal(sig: signal.Signals) -> None:
        received.append(sig.name)
        stopping.set()

    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_signal, sig)
            installed.append(sig)
    began: float | None = None
    try:
        async with serve(
            settings,
            reuse_port=role is not None,
            server_secret=role.secret if role is not None else None,
        ) as app:
            # What the start built lives as long as the process: out of the collector's
            # sight, which looks less often from here (``reveille.collector``).
            collector.settle()
            if role is not None:
                role.report_ready(app)
                await stopping.wait()
                began = _stopping(app, settings, received)
                return
            webui = app.webui
            logger.info(
                "%s",
                startup_banner(
                    settings,
                    port=app.adapter.port,
                    model=app.provider.name,
                    restored=app.restored,
                    webui_url=str(webui.url) if webui is not None else None,
                ),
            )
            await stopping.wait()
            began = _stopping(app, settings, received)
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
        if began is not None:
            # Everything is closed: turns ended or stopped, results recorded, stores shut.
            logger.info("stopped in %.1f s", time.monotonic() - began)


def _stopping(app: Any, settings: Settings, received: list[str]) -> float:
    """Says why and what the stop waits for; when it began (monotonic)."""
    logger.info(
        "stopping on %s: %d API turn(s) running; background work gets up to %.0f s to finish",
        received[0] if received else "request",
        int(getattr(app.adapter.turns, "active_runs", 0)),
        settings.drain_seconds,
    )
    return time.monotonic()
