"""The Deliveries page at /deliveries: the ledger's rows with their state, live; drop and
redeliver work from the browser."""

from __future__ import annotations

import re
import time

from playwright.sync_api import expect

from tests.webui.browser.test_wakeup_flow import create_session, finished_reply

GOAL = "count the stars"


def test_deliveries_page_drop_and_redeliver(start_server, new_tab, shots) -> None:
    server = start_server(demo_delay=4.0)
    tab = new_tab(server.url)
    page = tab.open("/")
    session_id = create_session(page, f"in the background: {GOAL}")
    finished_reply(page, 0)

    page.locator("#nav-deliveries").click()
    page.wait_for_url(re.compile(r"/deliveries$"))
    row = page.get_by_test_id("delivery-row").filter(has_text=GOAL)
    expect(row).to_have_count(1)
    expect(row).to_have_attribute("data-delivery-state", "pending")
    shots(page, "deliveries-pending")

    row.get_by_test_id("drop").click()
    expect(row).to_have_attribute("data-delivery-state", "dropped")
    shots(page, "deliveries-dropped")

    page.get_by_role("button", name="Dropped", exact=True).click()
    expect(row).to_have_count(1)
    page.get_by_role("button", name="Pending", exact=True).click()
    expect(row).to_have_count(0)
    page.get_by_role("button", name="All", exact=True).click()
    expect(row).to_have_count(1)

    # The work still finishes (its result is kept); a dropped row with a result can be
    # redelivered (409 before the result is in: the page says so and the button comes back).
    deadline = time.monotonic() + 30
    while row.get_attribute("data-delivery-state") == "dropped":
        assert time.monotonic() < deadline, server.output()
        button = row.get_by_test_id("redeliver")
        expect(button).to_be_enabled()
        button.click()
        page.wait_for_timeout(1000)
    # live from the event stream: pending again, then delivered by the wake-up
    server.wait_for(
        lambda: any(
            GOAL in str(r.get("summary"))
            for r in server.get("/api/deliveries?state=delivered")["deliveries"]
        ),
        "the redelivered row's delivery (server side)",
    )
    expect(row).to_have_attribute("data-delivery-state", "delivered")
    shots(page, "deliveries-redelivered")

    page.goto(f"{server.url}/?session={session_id}")
    expect(page.get_by_test_id("wakeup-card")).to_have_count(1, timeout=20000)
    expect(page.locator("[data-testid=message][data-wakeup=true]")).to_have_count(1)
    shots(page, "redelivered-wakeup")
    assert not tab.errors, tab.errors
