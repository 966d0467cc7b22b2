"""`reveille serve`: the API server and the completion watcher, until SIGINT/SIGTERM.

`reveille serve [--host H] [--port P] [--workers N] [--config FILE]` runs the
OpenAI-compatible API server, the web UI on its own port (``http://127.0.0.1:8787/`` by
default, ``REVEILLE_WEBUI_PORT``) with the embedded SQLite state under ``$REVEILLE_HOME``
(``~/.reveille``), the delivery ledger's re-offer scheduler and the completion watcher,
until SIGINT/SIGTERM. It logs where it listens, which model answers (saying plainly when
that is the offline demo model) and a copy-paste example. With ``--workers N`` (N > 1)
this process supervises N such servers on the same ports instead (``reveille.workers``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from typing import TYPE_CHECKING, Any

from gateway.wake import url_host
from reveille.settings import Settings, load_settings

if TYPE_CHECKING:
    from reveille.workers import WorkerRole

__all__ = ["add_serve_parser", "run_serve", "startup_banner"]

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


def startup_banner(
    settings: Settings,
    *,
    port: int,
    model: str,
    restored: int,
    webui_url: str | None = None,
    workers: int = 1,
) -> str:
    """What `reveille serve` tells its user once it listens."""
    url = f"http://{url_host(settings.host)}:{port}/v1"
    key = settings.api_key
    lines = [f"Reveille is listening on http://{settings.host}:{port}/v1"]
    if workers > 1:
        lines[0] += f" with {workers} workers"
        lines.append(
            f"  workers: {workers} processes share these ports and the state directory; "
            "limits such as REVEILLE_MAX_CONCURRENT_RUNS apply to each"
        )
    if webui_url:
        login = " (password: $REVEILLE_WEBUI_PASSWORD)" if settings.webui_password else ""
        lines.append(f"  web UI: {webui_url}{login}  <- open this in a browser")
    else:
        lines.append("  web UI: off (REVEILLE_WEBUI_PORT=0)")
    lines.append(f"  state directory: {settings.home}")
    if settings.provider == "demo":
        lines.append(
            f"  model: {model} -- the built-in OFFLINE DEMO model: scripted replies, not a "
            "language model. Set REVEILLE_PROVIDER=openai with OPENAI_API_KEY (and "
            "OPENAI_BASE_URL, REVEILLE_MODEL) to use a real one."
        )
        lines.append(
            "  try: 'in the background: <goal>' (a sub-agent; the result comes back to the "
            "session)"
            + (
                " or 'run in the background: <command>'"
                if settings.shell_enabled
                else " ('run in the background: <command>' needs REVEILLE_SHELL_ENABLED=1)"
            )
        )
    else:
        endpoint = settings.openai_base_url or "https://api.openai.com/v1"
        lines.append(f"  model: {model} via {endpoint}")
    lines.append(f"  shell tool: {'ENABLED' if settings.shell_enabled else 'off'}")
    lines.append(f"  telegram: {telegram_summary(settings)}")
    lines.append(
        f"  metrics: http://{url_host(settings.host)}:{port}/metrics (Prometheus"
        + (", bearer key required)" if key else ")")
    )
    if key:
        lines.append("  API key: required (Authorization: Bearer $API_SERVER_KEY)")
    else:
        lines.append(
            "  API key: none -- loopback only; continuing a session by X-Hermes-Session-Id "
            "is refused until API_SERVER_KEY is set"
        )
    if restored:
        lines.append(f"  re-offering {restored} undelivered completion(s) from an earlier run")
    shown_key = "$API_SERVER_KEY" if key else "unused"
    py_key = 'os.environ["API_SERVER_KEY"]' if key else '"unused"'
    lines += [
        "",
        "Talk to it:",
        f"  bash scripts/reveille chat --url {url}"
        + (" --key $API_SERVER_KEY" if key else "")
        + "   (from the checkout; `reveille chat` where the package is installed)",
        f"  curl -s {url}/chat/completions -H 'Content-Type: application/json' \\",
        *([f'    -H "Authorization: Bearer {shown_key}" \\'] if key else []),
        f'    -d \'{{"model": "{model}", "messages": [{{"role": "user", "content": "hello"}}]}}\'',
        "  python -c 'import os; from openai import OpenAI; "
        f'c = OpenAI(base_url="{url}", api_key={py_key}); '
        f'print(c.chat.completions.create(model="{model}", '
        'messages=[{"role": "user", "content": "hello"}]).choices[0].message.content)\'',
    ]
    return "\n".join(lines)


def telegram_summary(settings: Settings) -> str:
    """The banner's Telegram line: off, or how updates arrive and who may talk to the bot."""
    if not settings.telegram_bot_token:
        return "off (set TELEGRAM_BOT_TOKEN to start the bot)"
    mode = (
        f"webhook at {settings.telegram_webhook_url}"
        if settings.telegram_webhook_url
        else "long polling"
    )
    users = sorted(settings.telegram_allowed_user_ids)
    who = f"allowed users {', '.join(users)}" if users else "NO allowed users: it answers nobody"
    return f"{mode} via {settings.telegram_base_url}; {who}"


def run_serve(args: argparse.Namespace) -> int:
    from delivery.errors import LedgerError
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
        if settings.workers > 1:
            return supervise(
                settings,
                config=getattr(args, "config", None),
                verbose=bool(getattr(args, "verbose", False)),
            )
        if role is not None:
            role.enter()
        asyncio.run(serve_until_signalled(settings, role=role))
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
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stopping.set)
            installed.append(sig)
    try:
        async with serve(
            settings,
            reuse_port=role is not None,
            server_secret=role.secret if role is not None else None,
        ) as app:
            if role is not None:
                role.report_ready(app)
                await stopping.wait()
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
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
