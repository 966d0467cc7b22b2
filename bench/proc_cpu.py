"""The CPU this host's processes have used so far, read from ``/proc``: what the benches set
beside their figures (a server's process tree, a PostgreSQL server's processes)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ProcessCpu", "processes"]


@dataclass(frozen=True)
class ProcessCpu:
    name: str  # the kernel's name for it (``comm``): "postgres" for each PostgreSQL process
    parent: int
    seconds: float  # user and system


def processes() -> dict[int, ProcessCpu]:
    """Every process of this host by pid; empty where there is no ``/proc``."""
    tick = os.sysconf("SC_CLK_TCK")
    found: dict[int, ProcessCpu] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            name, rest = text[text.index("(") + 1 :].rsplit(")", 1)
            fields = rest.split()
        except (OSError, ValueError):
            continue  # gone meanwhile
        found[int(stat.parent.name)] = ProcessCpu(
            name, int(fields[1]), (int(fields[11]) + int(fields[12])) / tick
        )
    return found
