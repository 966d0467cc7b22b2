"""The routes behind the chat's tools: a chat's system prompt (PATCH /api/sessions/{id}),
export (GET /api/sessions/{id}/export) and message search (GET /api/search)."""

from __future__ import annotations

import base64
import json
from typing import Any

from gateway.session import MAX_SYSTEM_PROMPT_CHARS
from tests.sessions._support import append_turn
from tests.webui.conftest import Web


async def _patch(web: Web, sid: str, body: Any) -> Any:
    headers = {"X-CSRF-Token": web.csrf}
    return await web.http.patch(f"{web.base}/api/sessions/{sid}", json=body, headers=headers)


async def test_system_prompt_is_set_kept_and_cleared(web: Web) -> None:
    sid = await web.new_session("chat")
    r = await _patch(web, sid, {"system_prompt": "Be brief."})
    assert r.status == 200, await r.text()
    body = await r.json()
    assert body["session"]["system_prompt"] == "Be brief."
    assert body["session"]["title"] == "chat"  # a prompt alone leaves the title
    record = web.app.store.get_session(sid)
    assert record is not None and record.system_prompt == "Be brief."
    for bad in (7, ["x"], "x" * (MAX_SYSTEM_PROMPT_CHARS + 1)):
        r = await _patch(web, sid, {"system_prompt": bad})
        assert r.status == 400 and (await r.json())["error"]["code"] == "invalid_system_prompt"
    assert (await web.session(sid))["session"]["system_prompt"] == "Be brief."
    r = await _patch(web, sid, {"system_prompt": "  "})
    assert (await r.json())["session"]["system_prompt"] == ""
    record = web.app.store.get_session(sid)
    assert record is not None and record.system_prompt is None


async def test_export_answers_files_and_refuses_unknowns(web: Web) -> None:
    sid = await web.new_session("Notes / <b>2026</b>")
    append_turn(
        web.app.store,
        sid,
        [{"role": "user", "content": "first"}, {"role": "assistant", "content": "second"}],
    )
    r = await web.get(f"/api/sessions/{sid}/export?format=md")
    assert r.status == 200
    assert r.headers["Content-Type"].startswith("text/markdown")
    assert r.headers["Content-Disposition"] == 'attachment; filename="Notes-b-2026-b.md"'
    text = await r.text()
    assert text.startswith("# Notes / <b>2026</b>\n") and text.index("first") < text.index("second")
    r = await web.get(f"/api/sessions/{sid}/export?format=json")
    data = json.loads(await r.text())
    assert [m["content"] for m in data["messages"]] == ["first", "second"]
    r = await web.get(f"/api/sessions/{sid}/export?format=html")
    assert r.status == 400 and (await r.json())["error"]["code"] == "invalid_format"
    r = await web.get("/api/sessions/nope/export?format=md")
    assert r.status == 404


async def test_search_answers_snippets_in_pieces(web: Web) -> None:
    sid = await web.new_session("chat")
    web.app.store.append_message(sid, "user", "the <script>alert(1)</script> walrus sings")
    r = await web.get("/api/search?q=walrus")
    [hit] = (await r.json())["results"]
    assert hit["session_id"] == sid and hit["session_title"] == "chat"
    assert hit["message_id"].startswith("m") and hit["role"] == "user"
    assert {"text": "walrus", "hit": True} in hit["snippet"]
    assert (
        "".join(p["text"] for p in hit["snippet"]) == "the <script>alert(1)</script> walrus sings"
    )
    assert (await (await web.get("/api/search?q=")).json())["results"] == []


PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 32).decode()


async def test_attachments_that_are_not_images_or_too_large_are_refused(web: Web) -> None:
    sid = await web.new_session("chat")
    limit = (await (await web.get("/api/bootstrap")).json())["max_image_bytes"]
    cases = [
        ({"url": "data:text/html;base64,PHNjcmlwdD4="}, "not_an_image"),
        (
            {"url": "data:image/png;base64," + base64.b64encode(b"GIF89a...").decode()},
            "not_an_image",
        ),
        ({"url": "data:image/png;base64,!!!"}, "not_an_image"),
        ({"url": "https://example.com/cat.png"}, "not_an_image"),
        ({"name": "x"}, "invalid_attachment"),
        (
            {"url": "data:image/gif;base64," + base64.b64encode(b"GIF89a" + b"0" * limit).decode()},
            "image_too_large",
        ),
    ]
    for image, code in cases:
        r = await web.post(f"/api/sessions/{sid}/messages", {"text": "look", "images": [image]})
        assert r.status in (400, 413), (image, r.status)
        if r.status == 400:
            assert (await r.json())["error"]["code"] == code, image
    five = [{"url": f"data:image/png;base64,{PNG}"}] * 5
    r = await web.post(f"/api/sessions/{sid}/messages", {"text": "look", "images": five})
    assert (await r.json())["error"]["code"] == "too_many_images"
    assert web.app.store.messages(sid) == []  # nothing was sent, nothing stored
