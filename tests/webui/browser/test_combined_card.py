"""A combined wake-up in the browser: ONE card listing each result (goal, status, result,
delivery id), every field shown as text, also after a reload."""

from __future__ import annotations

import time
from pathlib import Path

from playwright.sync_api import expect

import tools.async_delegation as ad
from gateway.config import Platform
from gateway.session import SessionSource
from tests.sessions._support import make_session
from tests.stores import session_file_store
from tools.completion_queue import CompletionQueue

HOSTILE = "<img src=x onerror=\"window.__pwned='img'\"> <script>window.__pwned='s'</script>"
GOALS = ["map the coast", f"hostile {HOSTILE}", "count the ships"]


def _pending_results(home: Path, sid: str) -> list[str]:
    """Finished delegations of web UI session ``sid`` whose wake-ups are still pending: the
    server offers them together when it starts."""
    ad.reset_runtime()
    ad.configure_runtime(str(home / "ledger.db"), completion_queue=CompletionQueue())
    try:
        ids = []
        for goal in GOALS:
            res = ad.dispatch_async_delegation(
                goal=goal,
                runner=lambda goal=goal: {"status": "completed", "summary": f"{goal}: done"},
                session_key=f"agent:main:webui:dm:{sid}",
                origin_session_id=sid,
                origin_ui_session_id=sid,
            )
            ids.append(str(res["delegation_id"]))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            rows = [ad.get_durable_delegation(i) for i in ids]
            if all(r and r["state"] == "completed" for r in rows):
                break
            time.sleep(0.02)
        return ids
    finally:
        ad.reset_runtime()


def test_a_combined_wake_up_is_one_card_listing_each_result(
    tmp_path: Path, start_server, new_tab, shots
) -> None:
    home = tmp_path / "home"
    sid = "webui-combined-card"
    with session_file_store(home / "sessions.db") as store:
        make_session(
            store, sid, source=SessionSource(platform=Platform.WEBUI, chat_id=sid), title="fleet"
        )
    ids = _pending_results(home, sid)
    server = start_server(home=home, demo_delay=0.0)
    tab = new_tab(server.url)
    page = tab.open(f"/?session={sid}")

    card = page.get_by_test_id("wakeup-card")
    expect(card).to_have_count(1, timeout=30000)
    expect(card).to_have_attribute("data-work-kind", "combined")
    expect(card).to_contain_text("3 background results")
    results = card.get_by_test_id("wakeup-result")
    expect(results).to_have_count(3)
    for goal in GOALS:
        expect(card).to_contain_text(goal)  # the hostile one as those characters
    shown = sorted(results.nth(i).get_attribute("data-delivery-id") or "" for i in range(3))
    assert shown == sorted(ids)
    results.nth(1).locator("summary").click()
    shots(page, "combined-wakeup-card")

    page.reload()
    page.wait_for_selector("#app[data-ready=true]", timeout=15000)
    expect(page.get_by_test_id("wakeup-card")).to_have_count(1, timeout=15000)
    expect(page.get_by_test_id("wakeup-result")).to_have_count(3)
    made = page.evaluate(
        """() => ({
          pwned: window.__pwned ?? null,
          imgs: document.querySelectorAll('#transcript img[src="x"], [onerror]').length,
          scripts: document.querySelectorAll('#transcript script').length,
        })"""
    )
    assert made == {"pwned": None, "imgs": 0, "scripts": 0}, made
    assert not tab.dialogs and not tab.errors, (tab.dialogs, tab.errors)
