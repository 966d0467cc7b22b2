"""The sidebar lists every session of the store with its source: web UI sessions chat,
API sessions are shown read-only; the search narrows the list. (Without an API key: with
one and no web UI password, the web UI shows only its own sessions, ``tests/webui/test_gate``.)"""

from __future__ import annotations

import json
import urllib.request

from playwright.sync_api import expect

from tests.webui.browser._support import API_KEY
from tests.webui.browser.test_wakeup_flow import session_item


def test_sidebar_sources_readonly_and_search(start_server, new_tab, shots) -> None:
    server = start_server(demo_delay=0.2, env={"API_SERVER_KEY": ""})
    report = server.post("/api/sessions", {"title": "Quarterly <b>report</b>"})["session"]
    server.post("/api/sessions", {"title": "Holiday plans"})
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.api_port()}/v1/chat/completions",
        data=json.dumps(
            {"model": "reveille-demo", "messages": [{"role": "user", "content": "from the API"}]}
        ).encode(),
        headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        api_session = resp.headers["X-Hermes-Session-Id"]

    tab = new_tab(server.url)
    page = tab.open("/")
    items = page.get_by_test_id("session-item")
    expect(items).to_have_count(3)
    expect(session_item(page, report["id"])).to_contain_text("Quarterly <b>report</b>")
    expect(session_item(page, report["id"]).locator(".badge")).to_have_text("Web")
    api_item = page.locator("[data-testid=session-item][data-chat=false]")
    expect(api_item).to_have_count(1)
    expect(api_item.locator(".badge")).to_have_text("API")
    shots(page, "sidebar-sources")

    api_item.click()
    expect(page.locator("[data-testid=message][data-role=user]")).to_contain_text("from the API")
    expect(page.get_by_test_id("composer")).to_be_disabled()
    expect(page.locator("#composer-note")).to_contain_text("read-only")
    shots(page, "api-session-read-only")
    assert api_session

    page.get_by_test_id("search").fill("quarterly")
    expect(items).to_have_count(1)
    expect(items.first).to_have_attribute("data-session-id", report["id"])
    shots(page, "search")
    page.get_by_test_id("search").fill("")
    expect(items).to_have_count(3)
    assert not tab.errors, tab.errors


def test_with_an_api_key_and_no_password_the_sidebar_says_why_others_are_hidden(
    start_server, new_tab, shots
) -> None:
    """The gate's banner: a password-less web UI beside an API key lists its own chats only
    and says how to see the API's and Telegram's."""
    server = start_server(demo_delay=0.2)  # the default API key, no web UI password
    mine = server.post("/api/sessions", {"title": "Mine"})["session"]
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.api_port()}/v1/chat/completions",
        data=json.dumps(
            {"model": "reveille-demo", "messages": [{"role": "user", "content": "hidden"}]}
        ).encode(),
        headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30):
        pass
    tab = new_tab(server.url)
    page = tab.open("/")
    expect(page.get_by_test_id("gate-notice")).to_be_visible()
    expect(page.get_by_test_id("gate-notice")).to_contain_text("REVEILLE_WEBUI_PASSWORD")
    items = page.get_by_test_id("session-item")
    expect(items).to_have_count(1)
    expect(session_item(page, mine["id"])).to_contain_text("Mine")
    shots(page, "gate-notice")
    assert not tab.errors, tab.errors
