"""Renaming and deleting web UI sessions (PATCH / DELETE /api/sessions/{id}), and a failed
turn that keeps the user's message: stored marked failed, shown with its error, never sent
to the model as history, and shown once after its retry."""

from __future__ import annotations

from typing import Any

from agent.providers.base import ProviderError
from agent.providers.demo import DemoModel
from gateway.config import Platform
from gateway.session import MAX_TITLE_CHARS, SessionSource
from gateway.turns.conversation import build_context
from tests.sessions._support import make_session
from tests.webui.conftest import Web, settings_for, start_web, stop_web


async def _patch(web: Web, sid: str, body: Any, csrf: str | None = None) -> Any:
    headers = {"X-CSRF-Token": web.csrf if csrf is None else csrf}
    return await web.http.patch(f"{web.base}/api/sessions/{sid}", json=body, headers=headers)


async def _delete(web: Web, sid: str, csrf: str | None = None) -> Any:
    headers = {"X-CSRF-Token": web.csrf if csrf is None else csrf}
    return await web.http.delete(f"{web.base}/api/sessions/{sid}", headers=headers)


async def test_rename_a_web_ui_session(web: Web) -> None:
    sse = await web.stream()
    sid = await web.new_session("old")
    r = await _patch(web, sid, {"title": "  Plan   <b>it</b> "})
    assert r.status == 200, await r.text()
    assert (await r.json())["session"]["title"] == "Plan <b>it</b>"
    assert (await web.session(sid))["session"]["title"] == "Plan <b>it</b>"
    await sse.wait_for(lambda e: e[1] == "session" and e[2]["session"]["title"] == "Plan <b>it</b>")
    await sse.close()


async def test_rename_refuses_bad_input(web: Web) -> None:
    sid = await web.new_session("old")
    make_session(web.app.store, "api-sess", title="api")
    for title in ("", "   ", 7, None, "x" * (MAX_TITLE_CHARS + 1)):
        r = await _patch(web, sid, {"title": title})
        assert r.status == 400, title
        assert (await r.json())["error"]["code"] == "invalid_title"
    r = await _patch(web, "no-such-session", {"title": "x"})
    assert r.status == 404 and (await r.json())["error"]["code"] == "session_not_found"
    r = await _patch(web, "api-sess", {"title": "x"})
    assert r.status == 409 and (await r.json())["error"]["code"] == "not_a_webui_session"
    r = await _patch(web, sid, {"title": "x"}, csrf="")
    assert r.status == 403 and (await r.json())["error"]["code"] == "csrf_failed"
    assert (await web.session(sid))["session"]["title"] == "old"
    assert web.app.store.get_session("api-sess").title == "api"  # type: ignore[union-attr]


async def test_delete_a_web_ui_session(web: Web) -> None:
    sse = await web.stream()
    sid = await web.new_session("doomed")
    stream_id = (await web.say(sid, "hello"))["stream_id"]
    await sse.wait_for(lambda e: e[1] == "turn.end" and e[2]["stream_id"] == stream_id)
    r = await _delete(web, sid)
    assert r.status == 204, await r.text()
    await sse.wait_for(lambda e: e[1] == "session.deleted" and e[2]["session_id"] == sid)
    assert (await web.get(f"/api/sessions/{sid}")).status == 404
    listed = (await (await web.get("/api/sessions")).json())["sessions"]
    assert sid not in [s["id"] for s in listed]
    assert (await _delete(web, sid)).status == 404
    await sse.close()


async def test_delete_refuses_other_sources_unknown_ids_and_no_csrf(web: Web) -> None:
    store = web.app.store
    make_session(store, "api-sess", title="api")
    make_session(store, "tg-sess", source=SessionSource(platform=Platform.TELEGRAM, chat_id="4"))
    for other in ("api-sess", "tg-sess"):
        r = await _delete(web, other)
        assert r.status == 409 and (await r.json())["error"]["code"] == "not_a_webui_session"
        assert store.get_session(other) is not None
    r = await _delete(web, "no-such-session")
    assert r.status == 404
    sid = await web.new_session("kept")
    r = await _delete(web, sid, csrf="wrong")
    assert r.status == 403 and (await r.json())["error"]["code"] == "csrf_failed"
    assert (await web.get(f"/api/sessions/{sid}")).status == 200


class FailingOnce(DemoModel):
    """The demo model, whose next ``failures`` calls fail like a provider answering 500; it
    records every context it is sent."""

    def __init__(self) -> None:
        super().__init__(delay_seconds=0.0)
        self.failures = 0
        self.contexts: list[list[dict[str, Any]]] = []

    async def complete(self, messages: Any, **kw: Any) -> Any:
        self.contexts.append(list(messages))
        if self.failures:
            self.failures -= 1
            raise ProviderError("HTTP 500 from the model", status_code=500)
        return await super().complete(messages, **kw)


async def test_a_failed_turn_keeps_the_message_and_its_retry_replaces_it(tmp_path: Any) -> None:
    model = FailingOnce()
    web = await start_web(settings_for(tmp_path), provider=model)
    try:
        sse = await web.stream()

        async def say(sid: str, text: str) -> dict[str, Any]:
            stream_id = (await web.say(sid, text))["stream_id"]
            _, _, end = await sse.wait_for(
                lambda e: e[1] == "turn.end" and e[2]["stream_id"] == stream_id
            )
            return end

        sid = await web.new_session(None)
        assert (await say(sid, "first")).get("status") == "done"
        model.failures = 1
        end = await say(sid, "please <b>answer</b>")
        assert end["status"] == "error" and "500" in end["error"]
        items = (await web.session(sid))["items"]
        failed = items[-1]
        assert failed["role"] == "user" and failed["content"] == "please <b>answer</b>"
        assert failed["failed"] is True and "500" in failed["error"]
        assert (await web.session(sid))["session"]["title"] == "first"

        # the retry: the model never sees the failed message as history, only the new one
        assert (await say(sid, "please <b>answer</b>"))["status"] == "done"
        sent = [m["content"] for m in model.contexts[-1] if m["role"] == "user"]
        assert sent == ["first", "please <b>answer</b>"]
        items = (await web.session(sid))["items"]
        users = [i for i in items if i.get("role") == "user"]
        assert [u["content"] for u in users] == ["first", "please <b>answer</b>"]
        assert not any(u.get("failed") for u in users)
        await sse.close()
    finally:
        await stop_web(web)


def test_a_failed_message_is_not_model_history() -> None:
    def row(role: str, content: str, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"role": role, "content": content, "display_kind": None, "display_metadata": meta}

    history = [row("user", "a"), row("assistant", "b"), row("user", "c", {"failed": True})]
    context = build_context(history, [], [], {"role": "user", "content": "d"})
    assert [m["content"] for m in context] == ["a", "b", "d"]
