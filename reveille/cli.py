"""The `reveille` command: serve, chat, and the operator's ledger tools."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from reveille import (
    approvals,
    background,
    backup,
    db,
    deliveries,
    hooks_cmd,
    log_format,
    mcp_cmd,
    prune,
    schedules_cmd,
    webhooks_cmd,
)
from reveille.build_info import version_line
from reveille.chat import add_chat_parser
from reveille.serve import add_serve_parser
from reveille.settings import SettingsError


class _VersionAction(argparse.Action):
    """``--version``: the commit is looked up only when asked (it may run ``git``)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(version_line())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reveille",
        description="Reveille: an AI-agent runtime whose background work always comes home.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument(
        "--version", action=_VersionAction, help="the version and the git commit, then exit"
    )
    parser.add_argument(
        "--log-format",
        choices=log_format.FORMATS,
        default=os.environ.get("REVEILLE_LOG_FORMAT") or "text",
        help="text (default) or json: one object per line for log shippers (REVEILLE_LOG_FORMAT)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_serve_parser(sub)
    add_chat_parser(sub)
    deliveries.add_parser(sub)
    background.add_parser(sub)
    schedules_cmd.add_parser(sub)
    webhooks_cmd.add_parser(sub)
    hooks_cmd.add_parser(sub)
    approvals.add_parser(sub)
    db.add_parser(sub)
    backup.add_parsers(sub)
    prune.add_parser(sub)
    mcp_cmd.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        log_format.configure(verbose=args.verbose, fmt=args.log_format)
    except ValueError as exc:
        print(f"reveille: bad setting: REVEILLE_LOG_FORMAT: {exc}", file=sys.stderr)
        return 2
    # Processes this one starts (the workers of --workers N) log the same way.
    os.environ["REVEILLE_LOG_FORMAT"] = args.log_format
    try:
        return int(args.func(args) or 0)
    except SettingsError as exc:
        print(f"reveille: bad setting: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
