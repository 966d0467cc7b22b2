"""The chat's tools in the browser: export as Markdown and JSON (downloads from the server),
a per-chat system prompt that reaches the model, and opt-in browser notifications with the
unread count in the tab's title and a toast that never covers the transcript."""

from __future__ import annotations

import base64
import json
import re
import struct
import urllib.error
import zlib
from pathlib import Path

from playwright.sync_api import expect

from gateway.config import Platform
from gateway.session import SessionSource
from tests.sessions._support import append_turn, make_session
from tests.stores import session_file_store
from tests.webui.browser._support import SlowModel
from tests.webui.browser.test_wakeup_flow import (
    create_session,
    finished_reply,
    new_chat,
    send,
    session_item,
)

HOSTILE = "<img src=x onerror=\"window.__pwned='x'\">"

# Records what the page asks of the Notification API (the real one still answers).
NOTIFICATIONS = """
(() => {
  window.__notes = [];
  window.__asked = 0;
  const Real = window.Notification;
  if (!Real) return;
  window.Notification = new Proxy(Real, {
    construct(target, args) {
      window.__notes.push({ title: args[0], body: (args[1] || {}).body });
      return Reflect.construct(target, args);
    },
    get(target, prop) {
      if (prop === "requestPermission") {
        return (...args) => { window.__asked += 1; return target.requestPermission(...args); };
      }
      return Reflect.get(target, prop);
    },
  });
})();
"""


def test_export_as_markdown_and_json(tmp_path: Path, start_server, new_tab, shots) -> None:
    home = tmp_path / "home"
    sid = "export-me"
    with session_file_store(home / "sessions.db") as store:
        make_session(
            store,
            sid,
            source=SessionSource(platform=Platform.WEBUI, chat_id=sid),
            title=f"Trip {HOSTILE} plans",
        )
        append_turn(
            store,
            sid,
            [
                {"role": "user", "content": "Pack for *Oslo*\nin winter"},
                {"role": "assistant", "content": "- coat\n- boots"},
            ],
        )
    server = start_server(home=home, demo_delay=0.0)
    tab = new_tab(server.url)
    page = tab.open(f"/?session={sid}")
    expect(page.locator("[data-testid=message][data-role=assistant]")).to_have_count(1)

    page.get_by_test_id("export").click()
    shots(page, "export-menu")
    with page.expect_download() as info:
        page.get_by_test_id("export-md").click()
    download = info.value
    assert download.suggested_filename == "Trip-img-src-x-onerror-window.__pwned-x-plans.md"
    text = Path(download.path()).read_text(encoding="utf-8")
    assert text.startswith(f"# Trip {HOSTILE} plans\n")
    assert "## User · " in text and "Pack for *Oslo*\nin winter" in text
    assert "## Assistant · " in text and "- coat\n- boots" in text
    assert text.index("Pack for") < text.index("- coat")

    page.get_by_test_id("export").click()
    with page.expect_download() as info:
        page.get_by_test_id("export-json").click()
    data = json.loads(Path(info.value.path()).read_text(encoding="utf-8"))
    assert data["session"]["id"] == sid
    assert data["session"]["source_platform"] == "webui"
    assert [(m["role"], m["content"]) for m in data["messages"]] == [
        ("user", "Pack for *Oslo*\nin winter"),
        ("assistant", "- coat\n- boots"),
    ]
    assert all(isinstance(m["created_at"], float) for m in data["messages"])
    assert page.evaluate("window.__pwned === undefined")
    assert not tab.errors, tab.errors


def test_a_chat_system_prompt_reaches_the_model(start_server, new_tab, shots) -> None:
    model = SlowModel(["fine"], delay=0.01)
    server = start_server(demo_delay=0.0, env=model.env)
    tab = new_tab(server.url)
    page = tab.open("/")
    sid = create_session(page, "hello")
    finished_reply(page, 0)
    # whatever system messages the server itself sends; the chat adds its own to them
    before = [m for m in model.bodies[-1]["messages"] if m["role"] == "system"]

    page.get_by_test_id("system-prompt-button").click()
    prompt = f"Answer like a pirate. {HOSTILE}"
    page.get_by_test_id("system-prompt").fill(prompt)
    shots(page, "system-prompt-panel")
    page.get_by_test_id("save-system-prompt").click()
    expect(page.get_by_test_id("prompt-panel")).to_be_hidden()

    send(page, "second question")
    finished_reply(page, 1)
    systems = [m for m in model.bodies[-1]["messages"] if m["role"] == "system"]
    assert {"role": "system", "content": prompt} in systems
    assert len(systems) == len(before) + 1

    # Stored with the session: a reload (or another server) shows it and sends it.
    page.reload()
    page.wait_for_selector("#app[data-ready=true]")
    page.get_by_test_id("system-prompt-button").click()
    expect(page.get_by_test_id("system-prompt")).to_have_value(prompt)
    assert server.get(f"/api/sessions/{sid}")["session"]["system_prompt"] == prompt
    assert page.evaluate("window.__pwned === undefined")
    assert not tab.errors, tab.errors


def test_notifications_unread_count_and_toast_placement(start_server, new_tab, shots) -> None:
    server = start_server(demo_delay=1.0)
    tab = new_tab(server.url)
    tab.context.add_init_script(NOTIFICATIONS)
    page = tab.open("/")
    toggle = page.get_by_test_id("notify-toggle")
    expect(toggle).to_have_attribute("aria-pressed", "false")

    # Not allowed by the browser: asked, refused, stays off with a word why.
    toggle.click()
    expect(page.get_by_test_id("notice")).to_contain_text("blocked")
    expect(toggle).to_have_attribute("aria-pressed", "false")
    asked = page.evaluate("window.__asked")
    assert asked == 1 or page.evaluate("Notification.permission") == "denied"

    tab.context.grant_permissions(["notifications"], origin=server.url)
    toggle.click()
    expect(toggle).to_have_attribute("aria-pressed", "true")
    shots(page, "notifications-on")

    first = create_session(page, "hello")
    finished_reply(page, 0)
    send(page, "in the background: count the sheep")
    finished_reply(page, 1)
    new_chat(page)

    toast = page.get_by_test_id("toast")
    expect(toast).to_have_count(1, timeout=30000)
    expect(session_item(page, first)).to_have_attribute("data-unread", "true")
    expect(page).to_have_title(re.compile(r"^\(1\) "))
    notes = page.evaluate("window.__notes")
    assert any(n["title"] == "Background work finished" for n in notes), notes
    assert any("count the sheep" in (n["body"] or "") for n in notes), notes

    # The toast sits in the page's flow: it never covers the transcript.
    overlap = page.evaluate(
        """() => {
          const a = document.querySelector('[data-testid=toast]').getBoundingClientRect();
          const b = document.querySelector('#transcript').getBoundingClientRect();
          const apart = a.bottom <= b.top || b.bottom <= a.top;
          return !(apart || a.right <= b.left || b.right <= a.left);
        }"""
    )
    assert not overlap
    shots(page, "toast-and-unread-title")

    session_item(page, first).click()
    expect(page.get_by_test_id("wakeup-card")).to_have_count(1, timeout=20000)
    expect(page).not_to_have_title(re.compile(r"^\(\d+\) "))
    assert not tab.errors, tab.errors


def _png(width: int = 2, height: int = 2) -> bytes:
    """A real (tiny, red) PNG image."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    rows = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def test_image_attachments_reach_the_model_and_show_as_thumbnails(
    start_server, new_tab, shots
) -> None:
    model = SlowModel(["a", "red", "square"], delay=0.01)
    server = start_server(demo_delay=0.0, env=model.env)
    tab = new_tab(server.url)
    page = tab.open("/")
    sid = create_session(page, "hello")
    finished_reply(page, 0)
    picker = page.get_by_test_id("attach-input")

    picker.set_input_files([{"name": "notes.txt", "mimeType": "text/plain", "buffer": b"hi"}])
    expect(page.get_by_test_id("notice").last).to_contain_text("notes.txt is not an image")
    limit = int(server.get("/api/bootstrap")["max_image_bytes"])
    big = _png() + b"\x00" * limit
    picker.set_input_files([{"name": "huge.png", "mimeType": "image/png", "buffer": big}])
    expect(page.get_by_test_id("notice").last).to_contain_text("huge.png is too large")
    expect(page.get_by_test_id("attachment")).to_have_count(0)

    other = new_tab(server.url).open(f"/?session={sid}")  # the same chat in another tab
    name = f"{HOSTILE}.png"
    picker.set_input_files([{"name": name, "mimeType": "image/png", "buffer": _png()}])
    expect(page.get_by_test_id("attachment")).to_have_count(1)
    shots(page, "attachment-picked")
    send(page, "what is this?")
    finished_reply(page, 1)
    expect(page.get_by_test_id("attachment")).to_have_count(0)
    user = [m for m in model.bodies[-1]["messages"] if m["role"] == "user"][-1]
    assert isinstance(user["content"], list), user
    assert user["content"][0] == {"type": "text", "text": "what is this?"}
    url = user["content"][1]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    assert base64.b64decode(url.split(",", 1)[1]) == _png()

    thumbs = page.locator("[data-testid=message][data-role=user] [data-testid=thumbnail]")
    expect(thumbs).to_have_count(1)
    # The other tab saw the question live and shows its image once the turn is stored.
    shown = other.locator("[data-testid=message][data-role=user] [data-testid=thumbnail]")
    expect(shown).to_have_count(1)
    expect(other.locator("[data-testid=message][data-role=user]")).to_have_count(2)
    shots(page, "attachment-sent")
    page.reload()
    page.wait_for_selector("#app[data-ready=true]")
    expect(thumbs).to_have_count(1)  # stored with the message
    expect(thumbs.first).to_have_attribute("alt", name)
    assert page.evaluate("window.__pwned === undefined")
    detail = server.get(f"/api/sessions/{sid}")
    [with_image] = [i for i in detail["items"] if i.get("images")]
    assert with_image["content"] == "what is this?"
    assert not tab.errors, tab.errors


def test_edit_and_regenerate_replace_the_last_turn(start_server, new_tab, shots) -> None:
    model = SlowModel(["an", "answer"], delay=0.01)
    server = start_server(demo_delay=0.0, env=model.env)
    tab = new_tab(server.url)
    page = tab.open("/")
    sid = create_session(page, "hello")
    finished_reply(page, 0)
    send(page, "frist question")
    finished_reply(page, 1)
    users = page.locator("[data-testid=message][data-role=user]")

    edit = page.get_by_test_id("edit-message")
    expect(edit).to_have_count(1)  # only the last message
    users.last.hover()
    edit.click()
    page.get_by_test_id("edit-input").fill("first question")
    shots(page, "editing")
    page.get_by_test_id("save-edit").click()
    finished_reply(page, 2)
    expect(page.locator("[data-superseded=true]")).to_have_count(2)  # the old question and reply
    expect(users.last).to_have_text("first question")
    sent = [
        (m["role"], m["content"]) for m in model.bodies[-1]["messages"] if m["role"] != "system"
    ]
    assert sent == [("user", "hello"), ("assistant", "an answer"), ("user", "first question")]

    page.locator("[data-testid=message][data-role=assistant]").last.hover()
    page.get_by_test_id("regenerate").click()
    finished_reply(page, 3)
    sent = [
        (m["role"], m["content"]) for m in model.bodies[-1]["messages"] if m["role"] != "system"
    ]
    assert sent == [("user", "hello"), ("assistant", "an answer"), ("user", "first question")]
    assert model.requests == 4
    shots(page, "regenerated")

    page.reload()
    page.wait_for_selector("#app[data-ready=true]")
    expect(users).to_have_count(3)  # hello, the edited-away question, the question asked again
    expect(page.locator("[data-superseded=true]")).to_have_count(3)
    expect(users.nth(1)).to_have_attribute("data-superseded", "true")
    expect(users.nth(1)).to_have_text("frist question")
    expect(page.get_by_test_id("edit-message")).to_have_count(1)
    expect(page.get_by_test_id("regenerate")).to_have_count(1)
    shots(page, "after-reload")
    # An edit of a message that is not the last one is refused, and changes nothing.
    items = server.get(f"/api/sessions/{sid}")["items"]
    first_id = next(i["id"] for i in items if i.get("content") == "hello")
    try:
        server.post(f"/api/sessions/{sid}/messages", {"text": "x", "edit_of": first_id})
        raise AssertionError("an edit of an earlier message was accepted")
    except urllib.error.HTTPError as exc:
        assert exc.code == 409
    assert server.get(f"/api/sessions/{sid}")["items"] == items
    assert not tab.errors, tab.errors
