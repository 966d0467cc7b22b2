"""The chat's progress strip with real work (issue 28 items 2 and 3): a running command shows
its step and last output line, written to the store by the server that runs it, and its ✕
stops it: the command's process tree is gone, the row ends ``cancelled`` and the
conversation gets one wake-up saying the web UI stopped it, never the command's result."""

from __future__ import annotations

import time
import urllib.error
from typing import Any

import pytest
from playwright.sync_api import expect

from delivery.ledger import Ledger
from tests.stores import sqlite_ledger
from tests.tools.test_background_cancel import alive
from tests.webui.browser.test_wakeup_flow import create_session


def wait_until(check: Any, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_the_strip_shows_progress_and_its_x_stops_the_command(start_server, new_tab, shots) -> None:
    server = start_server(
        demo_delay=0.1,
        env={"REVEILLE_SHELL_ENABLED": "1", "REVEILLE_SHELL_APPROVALS": "never"},
    )
    pids = server.home / "pids"
    tab = new_tab(server.url)
    page = tab.open("/")
    create_session(
        page,
        f"run in the background: echo $$ > {pids}; sleep 300 & echo $! >> {pids}; "
        "echo '<b>step one</b> done'; wait",
    )
    work = page.get_by_test_id("background-work")
    expect(work).to_have_count(1)
    expect(work).to_have_attribute("data-state", "running")
    progress = work.get_by_test_id("background-progress")
    # Live: the strip asks again while the command runs, and the line it wrote shows, as text.
    expect(progress).to_have_text("running the command · <b>step one</b> done", timeout=20000)
    shots(page, "progress")
    wait_until(lambda: pids.exists() and len(pids.read_text().split()) == 2, "the pids")
    tree = [int(p) for p in pids.read_text().split()]
    unit_id = work.get_attribute("data-id")
    assert unit_id

    work.get_by_test_id("background-cancel").click()
    expect(work).to_have_count(0)
    expect(page.get_by_test_id("notice")).to_contain_text("Stopped.")
    for pid in tree:
        wait_until(lambda pid=pid: not alive(pid), f"pid {pid} to be gone")
    card = page.get_by_test_id("wakeup-card")
    expect(card).to_have_count(1, timeout=30000)
    expect(card).to_contain_text("Stopped by the web UI")
    shots(page, "stopped")

    ledger = Ledger(sqlite_ledger(server.home / "ledger.db"))
    try:
        row = ledger.get(unit_id)
        assert row is not None and row.state == "cancelled"
        assert row.event is not None and row.event["cancelled_by"] == "the web UI"
    finally:
        ledger.close()
    time.sleep(1.0)  # a result still on its way would arrive now: none does
    expect(card).to_have_count(1)
    with pytest.raises(urllib.error.HTTPError) as forged:
        server.post("/api/background/proc_forged/cancel", {})
    assert forged.value.code == 404
    assert not tab.dialogs and not tab.errors, (tab.dialogs, tab.errors)
