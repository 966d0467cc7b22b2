"""The application shell: CLI, settings and the composition of `reveille serve`."""

from __future__ import annotations

__all__ = ["version"]


def version() -> str:
    """The installed package's version (`reveille --version`, the web UI's bootstrap)."""
    try:
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version as installed

        return installed("reveille")
    except PackageNotFoundError:
        return "0.1.0"  # run from a checkout that was never installed
