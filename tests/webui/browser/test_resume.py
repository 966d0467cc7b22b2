"""The tab's one event stream resumes: a server restart under an open tab, and the work that
finished meanwhile, arrive without a reload and without a second EventSource. Markdown with
code streams in highlighted."""

from __future__ import annotations

import re

from playwright.sync_api import expect

from tests.webui.browser._support import SlowModel
from tests.webui.browser.test_wakeup_flow import (
    create_session,
    finished_reply,
    new_chat,
    send,
    session_item,
)


def test_stream_resumes_across_a_server_restart(start_server, new_tab, shots, tmp_path) -> None:
    home = tmp_path / "state"
    server = start_server(home=home, demo_delay=0.2)
    tab = new_tab(server.url)
    page = tab.open("/")
    first = create_session(page, "hello")
    finished_reply(page, 0)
    server.stop()
    expect(page.locator("#conn")).not_to_have_attribute("data-state", "live")
    shots(page, "server-down")

    # the work takes long enough to switch sessions before it comes home
    again = start_server(home=home, demo_delay=2.5, webui_port=server.webui_port)
    expect(page.locator("#conn")).to_have_attribute("data-state", "live", timeout=30000)
    send(page, "in the background: survive the restart")
    finished_reply(page, 1)
    new_chat(page)
    expect(page.get_by_test_id("toast")).to_contain_text("survive the restart", timeout=30000)
    expect(session_item(page, first)).to_have_attribute("data-unread", "true")
    session_item(page, first).click()
    expect(page.get_by_test_id("wakeup-card")).to_have_count(1)
    expect(page.locator("[data-testid=message][data-wakeup=true]")).to_have_count(1)
    shots(page, "after-restart")
    assert tab.event_sources() == 1, "the EventSource reconnected by itself"
    assert again.proc.poll() is None
    assert not tab.errors, tab.errors


MARKDOWN = [
    "Here",
    "is",
    "**code**:\n\n```python\ndef",
    "greet(name):\n   ",
    'return f"hi {name}"\n```\n\n|',
    "a",
    "|",
    "b",
    "|\n|---|---|\n|",
    "1",
    "|",
    "2",
    "|",
]


def test_markdown_and_code_stream_highlighted(start_server, new_tab, shots) -> None:
    model = SlowModel(MARKDOWN, delay=0.15)
    try:
        server = start_server(env=model.env)
        tab = new_tab(server.url, dark=True)
        page = tab.open("/")
        create_session(page, "show me code")
        reply = page.locator("[data-testid=message][data-role=assistant]").first
        expect(reply.locator("pre code")).to_have_count(1)
        expect(reply).to_have_class(re.compile(r"\bstreaming\b"))
        shots(page, "code-streaming")
        finished_reply(page, 0)
        expect(reply.locator("strong")).to_have_text("code")
        expect(reply.locator("pre code.hljs .hljs-keyword").first).to_have_text("def")
        expect(reply.locator("table td")).to_have_count(2)
        shots(page, "code-highlighted")
        assert not tab.errors, tab.errors
    finally:
        model.close()
