"""The controls of a turn in the browser: Stop really stops it, a shell command waits for
the user's approval on an approval card, and the login form when a password is set."""

from __future__ import annotations

import re

from playwright.sync_api import expect

from tests.webui.browser._support import SlowModel
from tests.webui.browser.test_wakeup_flow import create_session, finished_reply, send

WORDS = [f"piece{n:02d}" for n in range(60)]


def test_stop_button_stops_the_turn(start_server, new_tab, shots) -> None:
    model = SlowModel(WORDS, delay=0.1)
    try:
        server = start_server(env=model.env)
        tab = new_tab(server.url)
        page = tab.open("/")
        session_id = create_session(page, "talk for a while")
        reply = page.locator("[data-testid=message][data-role=assistant]").first
        expect(reply).to_contain_text("piece03")
        stop = page.get_by_test_id("stop")
        expect(stop).to_be_visible()
        shots(page, "streaming-with-stop")
        stop.click()
        expect(reply).to_have_attribute("data-status", "stopped")
        expect(reply).to_contain_text("Stopped")
        expect(stop).to_be_hidden()
        expect(page.get_by_test_id("send")).to_be_visible()
        shown = reply.locator(".message-body").inner_text()
        assert "piece59" not in shown, shown
        page.wait_for_timeout(1500)  # nothing more streams in
        assert reply.locator(".message-body").inner_text() == shown
        shots(page, "stopped")
        detail = server.get(f"/api/sessions/{session_id}")
        assert detail["active_stream"] is None
        # what was shown so far is kept in the transcript, marked stopped
        page.reload()
        page.wait_for_selector("#app[data-ready=true]")
        kept = page.locator("[data-testid=message][data-role=assistant]").first
        expect(kept).to_contain_text("piece00")
        expect(kept).to_contain_text("Stopped")
        assert not tab.errors, tab.errors
    finally:
        model.close()


def test_shell_command_waits_for_approval(start_server, new_tab, shots) -> None:
    server = start_server(demo_delay=0.2, env={"REVEILLE_SHELL_ENABLED": "1"})
    tab = new_tab(server.url)
    page = tab.open("/")
    create_session(page, "run in the background: echo '<b>approved</b>'")
    card = page.get_by_test_id("approval-card")
    expect(card).to_have_count(1)
    expect(card).to_contain_text("echo '<b>approved</b>'")
    expect(card.locator("b")).to_have_count(0)
    shots(page, "approval-pending")
    card.get_by_test_id("approve").click()
    expect(card).to_have_attribute("data-status", "approved")
    expect(card.get_by_test_id("approve")).to_have_count(0)
    finished_reply(page, 0)
    wake = page.get_by_test_id("wakeup-card")
    expect(wake).to_have_count(1, timeout=30000)
    expect(wake.locator("[data-field=command]")).to_contain_text("echo")
    expect(wake.locator("[data-field=exit-code]")).to_have_text("exit 0")
    expect(wake.locator("[data-field=result]")).to_contain_text("<b>approved</b>")
    expect(page.locator("[data-testid=message][data-wakeup=true]")).to_have_count(1)
    shots(page, "process-wakeup")

    send(page, "run in the background: echo denied")
    second = page.get_by_test_id("approval-card").nth(1)
    expect(second).to_be_visible()
    second.get_by_test_id("deny").click()
    expect(second).to_have_attribute("data-status", "denied")
    expect(page.locator("[data-testid=message][data-role=assistant]").last).not_to_have_class(
        re.compile(r"\bstreaming\b"), timeout=20000
    )
    shots(page, "approval-denied")
    assert not tab.errors, tab.errors


def test_login_form_when_a_password_is_set(start_server, new_tab, shots) -> None:
    server = start_server(demo_delay=0.2, env={"REVEILLE_WEBUI_PASSWORD": "correct horse"})
    tab = new_tab(server.url)
    page = tab.page
    page.goto(server.url + "/")
    form = page.get_by_test_id("login-form")
    expect(form).to_be_visible()
    page.get_by_test_id("password").fill("wrong")
    page.get_by_test_id("login").click()
    expect(page.locator("#login-error")).to_contain_text(re.compile("wrong|many", re.I))
    shots(page, "login-refused")
    page.get_by_test_id("password").fill("correct horse")
    page.get_by_test_id("login").click()
    page.wait_for_selector("#app[data-ready=true]")
    expect(form).to_be_hidden()
    create_session(page, "hello")
    expect(finished_reply(page, 0)).to_contain_text("demo")
    shots(page, "logged-in")
    assert tab.event_sources() == 1
    assert not tab.errors, tab.errors
