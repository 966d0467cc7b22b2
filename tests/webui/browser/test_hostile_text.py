"""A completion whose text holds <script>, <img onerror> and javascript: links renders as
text in the browser: nothing executes, no element is made of it, no such link survives."""

from __future__ import annotations

import re

from playwright.sync_api import expect

from tests.webui.browser.test_wakeup_flow import create_session, finished_reply

IMG = "<img src=x onerror=\"window.__pwned='img';alert('img')\">"
SCRIPT = "<script>window.__pwned='script';alert('script')</script>"
LINK = "[click me](javascript:window.__pwned='link') <a href=\"javascript:alert('a')\">a</a>"
GOAL = f"hostile {IMG} {SCRIPT} {LINK}"


def test_hostile_completion_renders_as_text(start_server, new_tab, shots) -> None:
    server = start_server(demo_delay=0.5)
    tab = new_tab(server.url)
    page = tab.open("/")
    create_session(page, f"in the background: {GOAL}")
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


def test_images_in_a_reply_never_load_from_the_api_or_afar(start_server, new_tab, shots) -> None:
    """A reply quoting markdown images pointed at the page's own event stream (which would
    hold a connection of the tab for good) and at a remote host loads neither: each shows as
    its description, in text; the icon from /static/ still loads under the CSP."""
    server = start_server(demo_delay=0.0)
    tab = new_tab(server.url)
    page = tab.open("/")
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    create_session(page, "look: ![tap](/api/events) ![tracker](https://tracker.invalid/p.png)")
    reply = finished_reply(page, 0)
    expect(reply).to_contain_text("[image: tap]")
    expect(reply).to_contain_text("[image: tracker]")
    assert reply.locator("img").count() == 0
    assert not any("tracker.invalid" in url for url in requested)
    assert sum("/api/events" in url for url in requested) <= 1  # the page's own stream only
    assert tab.errors == []
    shots(page, "images-described")
