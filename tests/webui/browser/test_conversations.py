"""The web UI tells conversations apart: an API session is named after its first message and
wears its surface's badge; each kind of delivery row is drawn as what it is (an approval's
answer is not a process card); messages show their time and can be copied."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from playwright.sync_api import expect

from gateway.config import Platform
from gateway.session import SessionSource
from tests.sessions._support import append_turn, make_session
from tests.stores import session_file_store
from tests.webui.browser.test_wakeup_flow import session_item

HOSTILE = "<img src=x onerror=\"window.__pwned='x'\">"


def _seed_api_session(home: Path, sid: str) -> None:
    """An API session whose transcript holds one delivery row of each kind."""
    with session_file_store(home / "sessions.db") as store:
        make_session(store, sid, source=SessionSource(platform=Platform.API_SERVER, chat_id=sid))
        append_turn(
            store,
            sid,
            [
                {"role": "user", "content": "run the backup"},
                {"role": "assistant", "content": "It needs your approval."},
            ],
        )
        store.append_message(
            sid,
            "system",
            f"The approved command ran: backup done {HOSTILE}",
            display_kind="approval_turn_result",
            display_metadata={"approval_id": "ap_1", "command": "tar czf /tmp/b.tgz ."},
            dedupe_key="approval:ap_1",
        )
        store.append_message(
            sid,
            "system",
            "Nobody answered the approval of `rm -rf /tmp/x` in time.",
            display_kind="approval_expired",
            display_metadata={"approval_id": "ap_2", "command": "rm -rf /tmp/x"},
        )
        store.append_message(
            sid,
            "system",
            "Wake-up you asked for: check the deploy.",
            display_kind="scheduled_wakeup",
            display_metadata={"note": "check the deploy"},
        )
        store.append_message(
            sid,
            "system",
            "Process finished: make test (exit 0)",
            display_kind="async_delegation_complete",
            display_metadata={
                "kind": "process",
                "delegation_id": "proc_1",
                "status": "completed",
                "command": "make test",
                "exit_code": 0,
                "output_tail": "42 passed",
            },
            dedupe_key="deleg:proc_1",
        )
        store.append_message(
            sid,
            "system",
            f"something new {HOSTILE}",
            display_kind="future_kind",
            display_metadata={},
        )


def test_delivery_rows_are_drawn_by_their_kind(
    tmp_path: Path, start_server, new_tab, shots
) -> None:
    home = tmp_path / "home"
    sid = "api-deliveries"
    _seed_api_session(home, sid)
    # No API key: a password-less web UI shows other surfaces' sessions only then (api.gate).
    server = start_server(home=home, demo_delay=0.0, env={"API_SERVER_KEY": ""})
    tab = new_tab(server.url)
    page = tab.open(f"/?session={sid}")
    # Stored untitled (before sessions were named): named after its first message now.
    expect(session_item(page, sid).locator(".session-title")).to_have_text("run the backup")
    expect(page.locator("#view-title")).to_have_text("run the backup")

    cards = page.get_by_test_id("delivery-card")
    expect(cards).to_have_count(3)
    answer = page.locator("[data-testid=delivery-card][data-display-kind=approval_turn_result]")
    expect(answer.locator("[data-field=title]")).to_have_text("Answer after approval")
    expect(answer.locator("[data-field=command]")).to_have_text("tar czf /tmp/b.tgz .")
    expect(answer.locator("[data-field=text]")).to_contain_text(f"backup done {HOSTILE}")
    # An expired approval is drawn as its approval card, settled (as the live one turns).
    expired = page.locator("[data-testid=approval-card][data-approval-id=ap_2]")
    expect(expired).to_have_attribute("data-status", "expired")
    expect(expired.locator(".approval-command")).to_have_text("rm -rf /tmp/x")
    expect(expired.locator(".approval-outcome")).to_contain_text("Expired")
    timer = page.locator("[data-testid=delivery-card][data-display-kind=scheduled_wakeup]")
    expect(timer.locator("[data-field=title]")).to_have_text("Scheduled wake-up")
    expect(timer.locator("[data-field=text]")).to_have_text(
        "Wake-up you asked for: check the deploy."
    )
    other = page.locator("[data-testid=delivery-card][data-display-kind=future_kind]")
    expect(other.locator("[data-field=text]")).to_have_text(f"something new {HOSTILE}")
    # Only the real process result is a process card; nothing reads "unknown" / "(no output)".
    process = page.get_by_test_id("wakeup-card")
    expect(process).to_have_count(1)
    expect(process).to_have_attribute("data-work-kind", "process")
    expect(process.locator("[data-field=result]")).to_have_text("42 passed")
    expect(page.locator("#transcript")).not_to_contain_text("(no output)")
    expect(page.locator("#transcript")).not_to_contain_text("unknown")
    assert page.evaluate("window.__pwned === undefined")
    shots(page, "delivery-kinds")
    assert not tab.errors, tab.errors


def test_api_session_title_badge_timestamps_and_copy(start_server, new_tab, shots) -> None:
    # No API key: a password-less web UI shows other surfaces' sessions only then (api.gate).
    server = start_server(demo_delay=0.0, env={"API_SERVER_KEY": ""})
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.api_port()}/v1/chat/completions",
        data=json.dumps(
            {
                "model": "reveille-demo",
                "messages": [{"role": "user", "content": "Plan the <b>release</b>\nsecond line"}],
            }
        ).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        sid = resp.headers["X-Hermes-Session-Id"]

    tab = new_tab(server.url)
    tab.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server.url)
    page = tab.open("/")
    item = session_item(page, sid)
    expect(item.locator(".session-title")).to_have_text("Plan the <b>release</b>")
    expect(item.locator(".badge")).to_have_text("API")
    item.click()
    expect(page.locator("#view-title")).to_have_text("Plan the <b>release</b>")
    expect(page.locator("#view-badge")).to_have_text("API")

    user = page.locator("[data-testid=message][data-role=user]")
    expect(user.get_by_test_id("timestamp")).to_have_count(1)
    assert user.get_by_test_id("timestamp").get_attribute("datetime")
    user.hover()
    user.get_by_test_id("copy-message").click()
    expect(user.get_by_test_id("copy-message")).to_have_attribute("data-label", "Copied")
    expect(user).to_have_text("Plan the <b>release</b>\nsecond line")  # the text alone
    copied = page.evaluate("navigator.clipboard.readText()")
    assert copied == "Plan the <b>release</b>\nsecond line"
    shots(page, "api-title-and-meta")
    assert not tab.errors, tab.errors


def test_search_over_messages_opens_the_chat_at_the_message(
    tmp_path: Path, start_server, new_tab, shots
) -> None:
    home = tmp_path / "home"
    with session_file_store(home / "sessions.db") as store:
        for sid, title in (("long-chat", "Long <i>chat</i>"), ("other-chat", "Other")):
            make_session(
                store, sid, source=SessionSource(platform=Platform.WEBUI, chat_id=sid), title=title
            )
        append_turn(
            store,
            "long-chat",
            [
                {"role": "user", "content": f"where is the zebracorn {HOSTILE} hiding?"},
                {"role": "assistant", "content": "No idea."},
            ],
        )
        for n in range(260):  # more than a page: the hit is on an earlier one
            append_turn(
                store,
                "long-chat",
                [
                    {"role": "user", "content": f"filler question {n}"},
                    {"role": "assistant", "content": f"filler answer {n}"},
                ],
            )
        store.append_message("other-chat", "user", "A Zebracorns parade")
    server = start_server(home=home, demo_delay=0.0)
    tab = new_tab(server.url)
    page = tab.open("/")

    page.get_by_test_id("search").fill("zebraCORN")
    hits = page.get_by_test_id("search-hit")
    expect(hits).to_have_count(2)
    expect(hits.first).to_have_attribute("data-session-id", "other-chat")
    expect(hits.first.locator("mark")).to_have_text("Zebracorns")
    old = page.locator("[data-testid=search-hit][data-session-id=long-chat]")
    expect(old).to_contain_text("Long <i>chat</i>")
    expect(old).to_contain_text(HOSTILE.split(" ")[0])
    shots(page, "search-hits")

    old.click()
    found = page.locator("[data-testid=message][data-found=true]")
    expect(found).to_have_count(1)
    expect(found).to_contain_text("zebracorn")
    expect(found).to_be_in_viewport()
    assert page.evaluate("window.__pwned === undefined")
    shots(page, "search-opened-at-message")

    page.get_by_test_id("search").fill("nothing-like-it")
    expect(page.get_by_test_id("search-results")).to_contain_text("No messages match.")
    page.get_by_test_id("search").fill("")
    expect(page.get_by_test_id("search-results")).to_be_hidden()
    assert not tab.errors, tab.errors
