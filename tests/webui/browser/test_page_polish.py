"""What a user of the page noticed (issue 19 item 5): an approval card survives a reload, a
failed turn keeps the message with a Retry, the sidebar renames, deletes and filters (and
"New chat" stores nothing until its first message), the strip says a command waits for
approval, and a server that went away shows one reconnecting banner, not a toast."""

from __future__ import annotations

import json
import re
import urllib.request
from typing import Any

from playwright.sync_api import expect

from tests.webui.browser._support import API_KEY, SlowModel
from tests.webui.browser.test_wakeup_flow import (
    create_session,
    finished_reply,
    new_chat,
    send,
    session_item,
)

USER = "[data-testid=message][data-role=user]"
ASSISTANT = "[data-testid=message][data-role=assistant]"


def reload(page: Any) -> None:
    page.reload()
    page.wait_for_selector("#app[data-ready=true]")


def test_an_approval_card_survives_a_reload(start_server, new_tab, shots) -> None:
    server = start_server(demo_delay=0.2, env={"REVEILLE_SHELL_ENABLED": "1"})
    tab = new_tab(server.url)
    page = tab.open("/")
    create_session(page, "run in the background: echo '<i>after reload</i>'")
    expect(page.get_by_test_id("approval-card")).to_have_attribute("data-status", "pending")
    reload(page)
    card = page.get_by_test_id("approval-card")
    expect(card).to_have_count(1)
    expect(card).to_have_attribute("data-status", "pending")
    expect(card).to_contain_text("echo '<i>after reload</i>'")
    expect(page.locator(USER)).to_have_count(1)  # the waiting turn's question, once
    shots(page, "approval-after-reload")
    card.get_by_test_id("approve").click()
    expect(card).to_have_attribute("data-status", "approved")
    finished_reply(page, 0)
    wake = page.get_by_test_id("wakeup-card")
    expect(wake).to_have_count(1, timeout=30000)
    expect(wake.locator("[data-field=exit-code]")).to_have_text("exit 0")
    expect(wake.locator("[data-field=result]")).to_contain_text("<i>after reload</i>")
    assert not tab.dialogs and not tab.errors, (tab.dialogs, tab.errors)


def test_a_failed_turn_keeps_the_message_with_a_retry(start_server, new_tab, shots) -> None:
    model = SlowModel(["answered", "at", "last"], delay=0.01)
    model.failing = True
    try:
        server = start_server(env=model.env)
        tab = new_tab(server.url)
        page = tab.open("/")
        create_session(page, "please <b>answer</b>")
        failed = page.locator(f"{USER}[data-status=failed]")
        expect(failed).to_have_count(1, timeout=30000)
        expect(failed.get_by_test_id("failed-note")).to_contain_text("500")
        expect(page.locator(ASSISTANT)).to_have_count(0)
        shots(page, "failed")
        reload(page)  # the message is stored: a reload keeps it, with its error and Retry
        expect(failed).to_have_count(1)
        expect(failed.locator(".message-body")).to_have_text("please <b>answer</b>")
        expect(failed.get_by_test_id("failed-note")).to_contain_text("500")
        shots(page, "failed-after-reload")

        model.failing = False
        failed.get_by_test_id("retry").click()
        expect(finished_reply(page, 0)).to_contain_text("answered at last")
        expect(page.locator(USER)).to_have_count(1)  # the retry replaced the failed one
        expect(failed).to_have_count(0)
        reload(page)
        expect(page.locator(USER)).to_have_count(1)
        expect(page.locator(USER)).to_have_text("please <b>answer</b>")
        expect(page.locator(ASSISTANT)).to_have_count(1)
        expect(failed).to_have_count(0)
        shots(page, "retried")
        assert not tab.dialogs and not tab.errors, (tab.dialogs, tab.errors)
    finally:
        model.close()


def _api_session(server: Any) -> str:
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.api_port()}/v1/chat/completions",
        data=json.dumps(
            {"model": "reveille-demo", "messages": [{"role": "user", "content": "via the API"}]}
        ).encode(),
        headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        return str(resp.headers["X-Hermes-Session-Id"])


def test_sidebar_renames_deletes_and_filters(start_server, new_tab, shots) -> None:
    # Without an API key: with one and no web UI password, API sessions are not listed.
    server = start_server(demo_delay=0.2, env={"API_SERVER_KEY": ""})
    api_session = _api_session(server)
    tab = new_tab(server.url)
    page = tab.open("/")
    items = page.get_by_test_id("session-item")
    expect(items).to_have_count(1)

    # "New chat" is a draft: nothing is stored until its first message
    new_chat(page)
    assert len(server.get("/api/sessions")["sessions"]) == 1
    keep = create_session(page, "a chat to keep")
    doomed = create_session(page, "a chat to delete")
    assert len(server.get("/api/sessions")["sessions"]) == 3
    finished_reply(page, 0)

    row = page.locator(f".session-row[data-session-id='{keep}']")
    row.hover()
    row.get_by_test_id("session-menu").click()
    row.get_by_test_id("rename-session").click()
    row.get_by_test_id("rename-input").fill("Renamed <b>chat</b>")
    row.get_by_test_id("rename-input").press("Enter")
    expect(session_item(page, keep)).to_contain_text("Renamed <b>chat</b>")
    expect(session_item(page, keep).locator("b")).to_have_count(0)
    shots(page, "renamed")

    row = page.locator(f".session-row[data-session-id='{doomed}']")
    row.hover()
    row.get_by_test_id("session-menu").click()
    row.get_by_test_id("delete-session").click()
    row.get_by_test_id("cancel-delete").click()  # asked in the row; cancel keeps it
    expect(session_item(page, doomed)).to_have_count(1)
    row.get_by_test_id("session-menu").click()
    row.get_by_test_id("delete-session").click()
    shots(page, "confirm-delete")
    row.get_by_test_id("confirm-delete").click()
    expect(session_item(page, doomed)).to_have_count(0)
    page.wait_for_url(lambda url: "session=" not in url)  # it was open: back to a draft
    ids = [s["id"] for s in server.get("/api/sessions")["sessions"]]
    assert doomed not in ids and keep in ids

    # API sessions are read-only here: no rename or delete; the filter hides them
    api_row = page.locator(f".session-row[data-session-id='{api_session}']")
    expect(api_row.locator(".session-actions")).to_be_hidden()
    filter_ = page.get_by_test_id("source-filter")
    filter_.select_option("webui")
    expect(items).to_have_count(1)
    expect(items.first).to_have_attribute("data-session-id", keep)
    shots(page, "web-ui-only")
    filter_.select_option("api_server")
    expect(items).to_have_count(1)
    expect(items.first).to_have_attribute("data-session-id", api_session)
    filter_.select_option("telegram")
    expect(items).to_have_count(0)
    filter_.select_option("")
    expect(items).to_have_count(2)

    reload(page)
    expect(session_item(page, keep)).to_contain_text("Renamed <b>chat</b>")
    expect(items).to_have_count(2)
    assert not tab.dialogs and not tab.errors, (tab.dialogs, tab.errors)


def test_the_strip_says_a_command_waits_for_approval(start_server, new_tab, shots) -> None:
    server = start_server(demo_delay=0.2, env={"REVEILLE_SHELL_ENABLED": "1"})
    tab = new_tab(server.url)
    page = tab.open("/")
    create_session(page, "run in the background: sleep 2; echo done")
    work = page.get_by_test_id("background-work")
    expect(work).to_have_count(1)
    expect(work).to_have_attribute("data-state", "approval")
    expect(work).to_contain_text("waiting for approval")
    expect(work).not_to_contain_text("running")
    expect(work).to_contain_text("sleep 2; echo done")
    shots(page, "waiting-for-approval")
    reload(page)
    expect(work).to_have_attribute("data-state", "approval")
    page.get_by_test_id("approve").click()
    expect(work).to_have_count(1)
    expect(work).to_have_attribute("data-state", "running")
    expect(work).to_contain_text("Command running")
    shots(page, "running")
    expect(page.get_by_test_id("wakeup-card")).to_have_count(1, timeout=30000)
    expect(work).to_have_count(0)
    assert not tab.dialogs and not tab.errors, (tab.dialogs, tab.errors)


def test_a_server_that_went_away_shows_a_reconnecting_banner(
    start_server, new_tab, shots, tmp_path
) -> None:
    home = tmp_path / "state"
    server = start_server(home=home, demo_delay=0.2)
    tab = new_tab(server.url)
    page = tab.open("/")
    create_session(page, "hello")
    finished_reply(page, 0)
    banner = page.get_by_test_id("reconnecting")
    expect(banner).to_be_hidden()
    server.stop()
    send(page, "are you there?")
    expect(banner).to_be_visible()
    expect(banner).to_have_text("Reconnecting…")
    expect(page.get_by_test_id("composer")).to_have_value("are you there?")  # kept to resend
    page.get_by_test_id("send").click()  # still down: still one banner, no toast
    expect(banner).to_have_count(1)
    expect(page.get_by_test_id("notice")).to_have_count(0)
    assert "Failed to fetch" not in page.locator("body").inner_text()
    shots(page, "reconnecting")

    start_server(home=home, demo_delay=0.2, webui_port=server.webui_port)
    expect(banner).to_be_hidden(timeout=30000)
    expect(page.locator("#conn")).to_have_attribute("data-state", "live")
    page.get_by_test_id("send").click()
    expect(finished_reply(page, 1)).to_contain_text(re.compile(r"\S"))
    expect(page.get_by_test_id("notice")).to_have_count(0)
    shots(page, "back")
    assert tab.event_sources() == 1
    assert not tab.dialogs and not tab.errors, (tab.dialogs, tab.errors)
