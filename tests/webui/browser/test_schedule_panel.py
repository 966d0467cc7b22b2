"""The chat's schedule panel: "every 3 seconds: ..." in a web UI session shows the schedule
with its period and next due time; its occurrences come home as wake-up cards restating the
note; its ✕ cancels it (the server lists it no more)."""

from __future__ import annotations

from playwright.sync_api import expect

from tests.webui.browser.test_wakeup_flow import create_session


def test_the_panel_shows_a_schedule_and_its_x_cancels_it(start_server, new_tab, shots) -> None:
    server = start_server(demo_delay=0.1, env={"REVEILLE_TIMERS_MIN_DELAY_SECONDS": "1"})
    tab = new_tab(server.url)
    page = tab.open("/")
    session_id = create_session(page, "every 3 seconds: drink <b>water</b>")
    item = page.get_by_test_id("schedule-item")
    expect(item).to_have_count(1, timeout=20000)
    expect(item).to_contain_text("drink <b>water</b>")  # as text, never markup
    expect(item).to_contain_text("every 3 s")
    expect(item.get_by_test_id("schedule-next")).to_contain_text("next 20")
    expect(page.get_by_test_id("wakeup-card").first).to_contain_text("water", timeout=30000)
    shots(page, "schedule")
    item.get_by_test_id("schedule-cancel").click()
    expect(item).to_have_count(0)
    listed = server.get(f"/api/schedules?session={session_id}")
    assert listed["schedules"] == []
    assert not tab.dialogs and not tab.errors, (tab.dialogs, tab.errors)
