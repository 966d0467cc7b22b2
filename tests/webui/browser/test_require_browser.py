"""Without chromium the browser tests skip and say why, except in CI, where they fail."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.webui.browser import _support


def test_missing_chromium_skips_outside_ci(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(_support, "CHROMIUM", tmp_path / "no-chromium")
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install chromium"):
        _support.require_browser()


def test_missing_chromium_fails_in_ci(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(_support, "CHROMIUM", tmp_path / "no-chromium")
    monkeypatch.setenv("CI", "1")
    with pytest.raises(pytest.fail.Exception, match="CI is set"):
        _support.require_browser()
