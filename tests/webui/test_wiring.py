"""How the web UI is wired: settings, the banner, the runner's hand-off of web UI
completions (unclaimed), the Deliveries API, refusals of start_session_turn."""

from __future__ import annotations

import asyncio
import time

import pytest

import tools.async_delegation as ad
from agent.providers.demo import DemoModel
from api import routes
from delivery.events import CompletionEvent
from gateway.config import Platform
from reveille.app import runtime_watch, serve
from reveille.banner import startup_banner
from reveille.settings import Settings, SettingsError, load_settings
from tests.webui.conftest import SlowDemo, Web, settings_for, start_web, stop_web


def test_settings_read_the_webui_port_and_password(tmp_path) -> None:
    env = {"REVEILLE_HOME": str(tmp_path)}
    assert load_settings(env).webui_port == 8787
    s = load_settings({**env, "REVEILLE_WEBUI_PORT": "0", "REVEILLE_WEBUI_PASSWORD": "pw"})
    assert (s.webui_port, s.webui_password) == (0, "pw")
    (tmp_path / "config.toml").write_text('[webui]\nport = 9999\npassword = "x"\n')
    s = load_settings(env)
    assert (s.webui_port, s.webui_password) == (9999, "x")
    with pytest.raises(SettingsError, match="webui_port"):
        load_settings({**env, "REVEILLE_WEBUI_PORT": "70000"})


def test_banner_prints_the_web_ui_address(tmp_path) -> None:
    banner = startup_banner(
        Settings(home=tmp_path),
        port=8642,
        model="reveille-demo",
        restored=0,
        webui_url="http://127.0.0.1:8787/",
    )
    assert "web UI: http://127.0.0.1:8787/" in banner
    off = startup_banner(Settings(home=tmp_path), port=8642, model="m", restored=0)
    assert "web UI: off" in off


class FakeClaiming:
    def __init__(self) -> None:
        self.offered: list[CompletionEvent] = []

    async def offer(self, event: CompletionEvent) -> str:
        self.offered.append(event)
        return "deferred"


async def test_runner_offers_web_ui_completions_unclaimed(tmp_path) -> None:
    async with serve(
        Settings(home=tmp_path / "home", port=0, webui_port=0, api_key="k"),
        provider=DemoModel(delay_seconds=0),
    ) as app:
        target = FakeClaiming()
        app.runner.register_target(Platform.WEBUI, target)
        res = await asyncio.to_thread(
            ad.dispatch_async_delegation,
            goal="g",
            runner=lambda: {"status": "completed", "summary": "s"},
            origin_ui_session_id="ui-1",
        )
        deleg = res["delegation_id"]
        for _ in range(200):
            if target.offered:
                break
            await asyncio.sleep(0.02)
        assert [e.key for e in target.offered] == [deleg]
        row = ad.get_durable_delegation(deleg)
        assert row is not None and row["delivery_attempts"] == 0  # the runner claimed nothing
        assert row["delivery_state"] == "pending"


async def test_deliveries_api_drop_and_redeliver(web: Web) -> None:
    sse = await web.stream()
    # Work whose routing key names no session of any surface: released, and pending (a
    # web UI session that does not exist would be dropped at once).
    res = await asyncio.to_thread(
        ad.dispatch_async_delegation,
        goal="orphan work",
        runner=lambda: {"status": "completed", "summary": "s"},
        session_key="agent:main:nowhere:dm:0",
    )
    deleg = res["delegation_id"]
    for _ in range(200):
        rows = (await (await web.get("/api/deliveries?state=pending")).json())["deliveries"]
        if any(r["id"] == deleg and r["work_state"] == "completed" for r in rows):
            break
        await asyncio.sleep(0.02)
    row = next(r for r in rows if r["id"] == deleg)
    assert row["summary"] == "orphan work" and row["max_attempts"] == 8
    assert (await web.post(f"/api/deliveries/{deleg}/redeliver")).status == 409
    r = await web.post(f"/api/deliveries/{deleg}/drop")
    assert r.status == 200 and (await r.json())["delivery"]["state"] == "dropped"
    assert (await web.post(f"/api/deliveries/{deleg}/drop")).status == 409
    dropped = await (await web.get("/api/deliveries?state=dropped&q=orphan")).json()
    assert [d["id"] for d in dropped["deliveries"]] == [deleg]
    r = await web.post(f"/api/deliveries/{deleg}/redeliver")
    assert r.status == 200 and (await r.json())["delivery"]["state"] == "pending"
    await sse.wait_for(
        lambda e: (
            e[1] == "delivery"
            and e[2]["delivery"]["state"] == "pending"
            and e[2]["delivery"]["id"] == deleg
        )
    )
    await sse.close()


async def test_stale_runtime_is_a_retryable_409(tmp_path) -> None:
    watched = tmp_path / "watched.py"
    watched.write_text("a = 1\n")
    stale = runtime_watch([watched])
    assert stale() is False
    time.sleep(0.01)
    watched.write_text("a = 2  # changed\n")
    assert stale() is True

    web = await start_web(settings_for(tmp_path))
    try:
        sid = await web.new_session()
        web.server.turns.runtime_stale = lambda: True
        answer = await asyncio.to_thread(
            routes.start_session_turn, sid, "[reveille:wake] x", source="process_wakeup"
        )
        assert answer["_status"] == 409 and answer["retryable"] is True
        assert answer["error"] == "agent_runtime_stale"
        r = await web.post(f"/api/sessions/{sid}/messages", {"text": "hi"})
        assert r.status == 409 and (await r.json())["error"]["code"] == "agent_runtime_stale"
    finally:
        await stop_web(web)


async def test_start_session_turn_refusals(web: Web) -> None:
    sid = await web.new_session()
    assert routes.start_session_turn(sid, "  ")["_status"] == 400
    answer = await asyncio.to_thread(routes.start_session_turn, "missing", "hi")
    assert answer["_status"] == 404
    ok = await asyncio.to_thread(routes.start_session_turn, sid, "hello")
    assert "_status" not in ok and set(ok) == {"stream_id", "session_id", "turn_id"}


async def test_stop_while_an_approval_waits_denies_it(tmp_path) -> None:
    settings = settings_for(tmp_path, shell_enabled=True, shell_workdir=str(tmp_path))
    web = await start_web(settings, provider=SlowDemo(step=0))
    try:
        sse = await web.stream()
        sid = await web.new_session()
        await web.say(sid, f"run in the background: touch {tmp_path}/never")
        _, _, pending = await sse.wait_for(lambda e: e[1] == "approval")
        r = await web.post(f"/api/sessions/{sid}/stop")
        assert (await r.json())["stopped"] is True
        await sse.wait_for(lambda e: e[1] == "approval" and e[2]["approval"]["status"] == "denied")
        end = await sse.wait_for(lambda e: e[1] == "turn.end")
        assert end[2]["status"] == "stopped"
        body = await web.session(sid)
        assert body["pending_approval"] is None and body["session"]["busy"] is False
        assert not (tmp_path / "never").exists()
        late = await web.post(
            f"/api/approvals/{pending['approval']['id']}", {"decision": "approve"}
        )
        assert late.status == 409
        await sse.close()
    finally:
        await stop_web(web)


async def test_work_naming_only_its_origin_session_still_comes_home(web: Web) -> None:
    sse = await web.stream()
    sid = await web.new_session()
    await asyncio.to_thread(
        ad.dispatch_async_delegation,
        goal="legacy work",
        runner=lambda: {"status": "completed", "summary": "s"},
        origin_session_id=sid,
    )
    _, _, wake = await sse.wait_for(lambda e: e[1] == "wakeup")
    assert wake["session_id"] == sid and wake["card"]["goal"] == "legacy work"
    await sse.close()


async def test_deliveries_api_says_when_a_row_was_pruned(web: Web) -> None:
    ledger = ad.get_runtime().ledger

    def pruned_row() -> None:
        ledger.create("deleg_pruned_web", kind="delegation", state="running")
        event = {"type": "async_delegation", "delegation_id": "deleg_pruned_web"}
        assert ledger.finish("deleg_pruned_web", expected="running", state="completed", event=event)
        assert ledger.drop("deleg_pruned_web", "session deleted")
        later = time.time() + 86400
        assert ledger.backend.prune_settled(["deleg_pruned_web"], later, later, "retention") == 1

    await asyncio.to_thread(pruned_row)
    r = await web.post("/api/deliveries/deleg_pruned_web/redeliver")
    assert r.status == 410
    error = (await r.json())["error"]
    assert error["code"] == "delivery_pruned" and "was pruned on " in error["message"]
    assert (await web.post("/api/deliveries/deleg_never_was/redeliver")).status == 404
