"""Browser end to end with the demo model: chat, background work, the completion coming home
as a toast, an unread mark, a wake-up card and the agent's wake-up reply, exactly once; live
with the tab open, and waiting in the transcript when the tab was closed."""

from __future__ import annotations

import re
import time
from typing import Any

from playwright.sync_api import expect

from tests.webui.browser._support import iter_items

GOAL = "index the docs"
ASSISTANT = "[data-testid=message][data-role=assistant]"
WAKE_REPLY = "[data-testid=message][data-role=assistant][data-wakeup=true]"


def session_item(page: Any, session_id: str) -> Any:
    return page.locator(f"[data-testid=session-item][data-session-id='{session_id}']")


def current_session_id(page: Any) -> str:
    match = re.search(r"[?&]session=([^&]+)", page.url)
    assert match, page.url
    return match.group(1)


def new_chat(page: Any) -> None:
    """ "New chat": a draft in the page, stored nowhere until its first message."""
    before = page.locator("[data-testid=session-item]").count()
    page.get_by_test_id("new-session").click()
    page.wait_for_url(lambda url: "session=" not in url)
    expect(page.locator("[data-testid=session-item][aria-current=page]")).to_have_count(0)
    expect(page.locator("[data-testid=session-item]")).to_have_count(before)


def create_session(page: Any, first_message: str) -> str:
    """A new chat and its first message, which creates the session; its id."""
    before = page.locator("[data-testid=session-item]").count()
    new_chat(page)
    send(page, first_message)
    page.wait_for_url(lambda url: "session=" in url)
    expect(page.locator("[data-testid=session-item]")).to_have_count(before + 1)
    session_id = current_session_id(page)
    expect(session_item(page, session_id)).to_have_attribute("aria-current", "page")
    return session_id


def send(page: Any, text: str) -> None:
    composer = page.get_by_test_id("composer")
    composer.fill(text)
    composer.press("Enter")


def finished_reply(page: Any, index: int) -> Any:
    """The `index`-th assistant message once its turn ended (not streaming any more)."""
    reply = page.locator(ASSISTANT).nth(index)
    expect(reply).not_to_have_class(re.compile(r"\bstreaming\b"), timeout=20000)
    expect(reply).not_to_be_empty()
    return reply


def start_background_work(page: Any, shots: Any) -> None:
    send(page, "hello")
    expect(page.locator("[data-testid=message][data-role=user]").first).to_have_text("hello")
    reply = finished_reply(page, 0)
    expect(reply).to_contain_text("demo")
    shots(page, "reply-streamed")
    send(page, f"in the background: {GOAL}")
    started = finished_reply(page, 1)
    expect(started).to_contain_text(re.compile(r"start|background", re.I))
    shots(page, "background-started")


def assert_home_once(page: Any, shots: Any) -> None:
    card = page.get_by_test_id("wakeup-card")
    expect(card).to_have_count(1, timeout=20000)
    expect(card).to_have_attribute("data-status", re.compile(r".+"))
    # goal, status and result are visible without a click
    expect(card.locator("[data-field=goal]")).to_be_visible()
    expect(card.locator("[data-field=goal]")).to_contain_text(GOAL)
    expect(card.locator("[data-field=status]")).to_be_visible()
    expect(card.locator("[data-field=result]")).to_be_visible()
    expect(card.locator("[data-field=result]")).to_contain_text(GOAL)
    wake = page.locator(WAKE_REPLY)
    expect(wake).to_have_count(1, timeout=20000)
    expect(wake).not_to_have_class(re.compile(r"\bstreaming\b"))
    expect(wake).to_contain_text(GOAL)
    # the reply comes after its card
    order = page.evaluate(
        """() => {
          const card = document.querySelector('[data-testid=wakeup-card]');
          const wake = document.querySelector('[data-wakeup=true]');
          return Boolean(card.compareDocumentPosition(wake) & Node.DOCUMENT_POSITION_FOLLOWING);
        }"""
    )
    assert order, "the wake-up reply is not after its card"
    card.locator("summary").click()
    shots(page, "wakeup-card-and-reply")
    time.sleep(1.0)  # nothing arrives twice, even late
    expect(page.get_by_test_id("wakeup-card")).to_have_count(1)
    expect(page.locator(WAKE_REPLY)).to_have_count(1)


def test_background_work_comes_home_live(start_server, new_tab, shots) -> None:
    server = start_server(demo_delay=3.0)
    tab = new_tab(server.url)
    page = tab.open("/")
    shots(page, "opened")
    new_chat(page)
    shots(page, "new-chat")
    start_background_work(page, shots)
    first = current_session_id(page)
    # Long work shows progress: the strip names it and counts the seconds until it is home.
    work = page.get_by_test_id("background-work")
    expect(work).to_have_count(1)
    expect(work).to_have_attribute("data-state", "running")
    expect(work).to_contain_text(GOAL)
    expect(work.locator("[data-field=elapsed]")).to_have_text(re.compile(r"^\d+ s$"))
    shots(page, "background-progress")

    new_chat(page)
    expect(page.get_by_test_id("background-work")).to_have_count(0)  # not this chat's
    shots(page, "switched-away")

    toast = page.get_by_test_id("toast")
    expect(toast).to_have_count(1, timeout=30000)
    expect(toast).to_contain_text(GOAL)
    expect(session_item(page, first)).to_have_attribute("data-unread", "true")
    shots(page, "toast-and-unread")

    session_item(page, first).click()
    page.wait_for_url(re.compile(f"session={first}"))
    assert_home_once(page, shots)
    expect(page.get_by_test_id("background-work")).to_have_count(0)  # home: nothing pending
    expect(session_item(page, first)).not_to_have_attribute("data-unread", "true")
    assert tab.event_sources() == 1, "one EventSource per tab"
    assert not tab.dialogs and not tab.errors, (tab.dialogs, tab.errors)


def test_background_work_comes_home_with_the_tab_closed(start_server, new_tab, shots) -> None:
    server = start_server(demo_delay=2.0)
    tab = new_tab(server.url)
    page = tab.open("/")
    new_chat(page)
    start_background_work(page, shots)
    session_id = current_session_id(page)
    tab.context.close()  # the tab is gone while the work finishes

    def wakeup_turn_done() -> bool:
        detail = server.get(f"/api/sessions/{session_id}")
        replies = [m for m in iter_items(detail, "message") if m.get("wakeup")]
        cards = list(iter_items(detail, "wakeup"))
        return bool(cards and replies and not detail.get("active_stream"))

    server.wait_for(wakeup_turn_done, "the wake-up turn, with no tab open")

    tab = new_tab(server.url)
    page = tab.open("/")
    expect(session_item(page, session_id)).to_have_attribute("data-unread", "true")
    shots(page, "reopened-unread")
    session_item(page, session_id).click()
    assert_home_once(page, shots)
    expect(session_item(page, session_id)).not_to_have_attribute("data-unread", "true")
    assert tab.event_sources() == 1
    assert not tab.dialogs and not tab.errors, (tab.dialogs, tab.errors)


def test_phone_width_smoke(start_server, new_tab, shots) -> None:
    server = start_server(demo_delay=0.2)
    tab = new_tab(server.url, width=390, height=844, dark=True)
    page = tab.open("/")
    shots(page, "phone-opened")
    page.locator("#new-session-top").click()
    send(page, "hello from a phone")
    page.wait_for_url(re.compile(r"[?&]session="))
    expect(finished_reply(page, 0)).to_contain_text("demo")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the page scrolls sideways at 390 px ({width} px wide)"
    box = page.get_by_test_id("composer").bounding_box()
    assert box and box["x"] >= 0 and box["x"] + box["width"] <= 390, box
    shots(page, "phone-chat")
    page.locator("#menu-btn").click()
    expect(page.get_by_test_id("session-item")).to_have_count(1)
    expect(page.get_by_test_id("new-session")).to_be_in_viewport()
    shots(page, "phone-sessions")
    page.keyboard.press("Escape")
    page.get_by_test_id("theme-toggle").click()
    assert page.evaluate("document.documentElement.dataset.theme") == "light"
    assert not tab.errors, tab.errors
