"""A completion whose text holds <script>, <img onerror> and javascript: links renders as
text in the browser: nothing executes, no element is made of it, no such link survives."""

from __future__ import annotations

import re

from playwright.sync_api import expect

from tests.webui.browser.test_wakeup_flow import create_session, finished_reply, send

IMG = "<img src=x onerror=\"window.__pwned='img';alert('img')\">"
SCRIPT = "<script>window.__pwned='script';alert('script')</script>"
LINK = "[click me](javascript:window.__pwned='link') <a href=\"javascript:alert('a')\">a</a>"
GOAL = f"hostile {IMG} {SCRIPT} {LINK}"


def test_hostile_completion_renders_as_text(start_server, new_tab, shots) -> None:
    server = start_server(demo_delay=0.5)
    tab = new_tab(server.url)
    page = tab.open("/")
    create_session(page)
    send(page, f"in the background: {GOAL}")
    finished_reply(page, 0)

    card = page.get_by_test_id("wakeup-card")
    expect(card).to_have_count(1, timeout=30000)
    # the goal shows as those characters
    expect(card.locator("[data-field=goal]")).to_contain_text(IMG)
    expect(card.locator("[data-field=goal]")).to_contain_text(SCRIPT)
    expect(card.locator("[data-field=result]")).to_contain_text("<img src=x onerror=")
    expect(page.locator("[data-testid=message][data-role=user]").first).to_contain_text(IMG)
    wake = page.locator("[data-testid=message][data-wakeup=true]")
    expect(wake).to_have_count(1, timeout=20000)
    expect(wake).not_to_have_class(re.compile(r"\bstreaming\b"))
    # the agent's markdown reply quotes the goal: its raw HTML shows as characters too
    expect(wake).to_contain_text("<img src=x onerror=")
    card.locator("summary").click()
    shots(page, "hostile-rendered")

    # every link that survived the sanitizer is harmless; clicking them runs nothing
    for link in page.locator("#transcript a").all():
        href = (link.get_attribute("href") or "").strip().lower()
        assert not href.startswith(("javascript:", "data:", "vbscript:")), href
        link.click(modifiers=["Alt"], no_wait_after=True)
    page.wait_for_timeout(500)

    made = page.evaluate(
        """() => ({
          pwned: window.__pwned ?? null,
          imgs: document.querySelectorAll('#transcript img[src="x"], [onerror]').length,
          scripts: document.querySelectorAll('#transcript script, #toasts script').length,
          jsLinks: [...document.querySelectorAll('a[href]')]
            .filter((a) => /^\\s*javascript:/i.test(a.getAttribute('href'))).length,
        })"""
    )
    assert made == {"pwned": None, "imgs": 0, "scripts": 0, "jsLinks": 0}, made
    assert not tab.dialogs, tab.dialogs
    assert not tab.errors, tab.errors
