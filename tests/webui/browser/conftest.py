"""Fixtures of the browser tests: one chromium per run, a real `reveille serve` per test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.webui.browser._support import (
    CHROMIUM,
    CHROMIUM_ARGS,
    INIT_SCRIPT,
    Shots,
    WebUIServer,
    require_browser,
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    # Module scope, not session: the sync Playwright API keeps an event loop running in this
    # thread while it is started, which the suite's asyncio tests after these could not use.
    require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., WebUIServer]]:
    servers: list[WebUIServer] = []

    def start(*, home: Path | None = None, **kwargs: Any) -> WebUIServer:
        server = WebUIServer(home or tmp_path / f"home{len(servers)}", **kwargs)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


class Tab:
    """A page with what the tests check on every step: dialogs, page errors, EventSources."""

    def __init__(self, context: Any, base_url: str) -> None:
        self.context = context
        self.base_url = base_url
        self.page = context.new_page()
        self.dialogs: list[str] = []
        self.errors: list[str] = []
        self.page.on("dialog", self._dialog)
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        # a Content-Security-Policy violation (an inline script or style) is an error too
        self.page.on("console", self._console)

    def _console(self, message: Any) -> None:
        if message.type == "error" and "Content Security Policy" in message.text:
            self.errors.append(message.text)

    def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def open(self, path: str = "/") -> Any:
        self.page.goto(self.base_url + path)
        self.page.wait_for_selector("#app[data-ready=true]", timeout=15000)
        return self.page

    def event_sources(self) -> int:
        return int(self.page.evaluate("window.__eventSources"))


@pytest.fixture
def new_tab(browser: Any) -> Iterator[Callable[..., Tab]]:
    contexts: list[Any] = []

    def make(base_url: str, *, width: int = 1280, height: int = 800, dark: bool = False) -> Tab:
        context = browser.new_context(
            viewport={"width": width, "height": height},
            color_scheme="dark" if dark else "light",
        )
        context.set_default_timeout(20000)
        context.add_init_script(INIT_SCRIPT)
        contexts.append(context)
        return Tab(context, base_url)

    yield make
    for context in contexts:
        context.close()


@pytest.fixture
def shots(request: pytest.FixtureRequest) -> Shots:
    return Shots(request.node.name)
