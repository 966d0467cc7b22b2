"""Whether the ``[ecosystem]`` extra (the OpenAI-ecosystem clients these tests drive) is
installed: a test module without it skips and says why, except in CI, where it fails."""

from __future__ import annotations

import importlib.util
import os

import pytest


def require_ecosystem(*modules: str) -> None:
    """Skip the calling module (with the reason) when ``modules`` are missing; fail in CI."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if not missing:
        return
    reason = (
        f"the ecosystem tests need {', '.join(missing)}: the [ecosystem] extra "
        '(bash scripts/venv-ready "[dev,ecosystem]"; scripts/test installs it)'
    )
    if os.environ.get("CI"):
        pytest.fail(reason + "; CI is set, so this is a failure, not a skip", pytrace=False)
    pytest.skip(reason, allow_module_level=True)
