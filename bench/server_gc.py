"""The garbage collector of a bench that stands for the server's process: set as
`reveille serve` sets it once started (``reveille.collector``), or left as CPython's
(``--collector default``), for comparison."""

from __future__ import annotations

import argparse

from reveille import collector


def add_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--collector",
        choices=("server", "default"),
        default="server",
        help="the garbage collector as `reveille serve` sets it once started"
        " (reveille.collector), or CPython's default",
    )


def apply(args: argparse.Namespace) -> None:
    """Call where the server would: once its start is done."""
    if args.collector == "server":
        collector.settle()
