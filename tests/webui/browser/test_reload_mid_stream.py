"""Reloading the page in the middle of a streamed reply shows the whole reply, once."""

from __future__ import annotations

import re

from playwright.sync_api import expect

from tests.webui.browser._support import SlowModel
from tests.webui.browser.test_wakeup_flow import create_session

WORDS = [f"word{n:02d}" for n in range(40)]


def test_reload_mid_stream_shows_the_whole_reply_once(start_server, new_tab, shots) -> None:
    model = SlowModel(WORDS, delay=0.1)
    try:
        server = start_server(env=model.env)
        tab = new_tab(server.url)
        page = tab.open("/")
        create_session(page, "tell me forty words")
        reply = page.locator("[data-testid=message][data-role=assistant]")
        expect(reply.first).to_contain_text("word05", timeout=20000)
        expect(reply.first).to_have_class(re.compile(r"\bstreaming\b"))
        shots(page, "mid-stream")

        page.reload()
        page.wait_for_selector("#app[data-ready=true]")
        expect(reply).to_have_count(1)
        shots(page, "reloaded-mid-stream")
        expect(reply.first).not_to_have_class(re.compile(r"\bstreaming\b"), timeout=20000)
        text = reply.first.inner_text()
        for word in WORDS:
            assert text.count(word) == 1, (word, text)
        assert text.split() == WORDS, text
        expect(reply).to_have_count(1)
        expect(page.locator("[data-testid=message][data-role=user]")).to_have_count(1)
        shots(page, "reply-complete")
        assert tab.event_sources() == 1
        assert not tab.errors, tab.errors
    finally:
        model.close()
