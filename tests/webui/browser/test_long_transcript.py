"""A long transcript comes a page at a time: the newest messages first, earlier ones as the
reader scrolls up (or asks), in order, with the view staying where the reader was."""

from __future__ import annotations

from playwright.sync_api import expect

from gateway.config import Platform
from gateway.session import SessionSource
from tests.sessions._support import make_session
from tests.stores import session_file_store
from tests.webui.browser.test_wakeup_flow import session_item

MESSAGES = 450


def test_a_long_transcript_loads_newest_first_and_earlier_on_demand(
    start_server, new_tab, tmp_path, shots
) -> None:
    home = tmp_path / "long"
    with session_file_store(home / "sessions.db") as store:
        make_session(
            store, "webui-long", source=SessionSource(platform=Platform.WEBUI, chat_id="webui-long")
        )
        for i in range(MESSAGES):
            store.append_message("webui-long", "user" if i % 2 == 0 else "assistant", f"m{i}")
    server = start_server(home=home, demo_delay=0.0)
    tab = new_tab(server.url)
    page = tab.open("/")
    session_item(page, "webui-long").click()
    messages = page.locator("[data-testid=message]")
    expect(messages.last).to_contain_text(f"m{MESSAGES - 1}")
    shown = messages.count()
    assert 0 < shown <= 201
    older = page.get_by_test_id("load-older")
    expect(older).to_have_count(1)
    older.click()
    expect(messages).to_have_count(min(MESSAGES, shown + 200))
    # Scrolling to the top fetches the page before, as asking does.
    messages.first.evaluate("node => node.parentElement.scrollTo(0, 0)")
    expect(messages).to_have_count(MESSAGES)
    expect(page.get_by_test_id("load-older")).to_have_count(0)
    texts = messages.all_inner_texts()
    assert [t.strip() for t in texts] == [f"m{i}" for i in range(MESSAGES)]
    assert tab.errors == []
    shots(page, "long-transcript-all-loaded")
