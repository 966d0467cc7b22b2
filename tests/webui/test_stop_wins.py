"""Stop wins in the web UI, or loses cleanly: never a turn stored both whole and stopped.

Stops timed around the store of a turn whose model ends when the test says (``SlowDemo``'s
gate): before the end, at it, while the store runs (held by ``StoreSpy`` until the Stop is
on its way), just after it. ``{"stopped": true}`` must mean the transcript holds the turn
once, marked stopped; ``{"stopped": false}`` that it holds the whole reply once.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tests.api_server.test_cancel_wins import TIMINGS, StoreSpy
from tests.webui.conftest import SlowDemo, settings_for, start_web, stop_web

RACES = 60


async def test_a_stop_timed_around_the_store_never_stores_the_turn_twice(tmp_path: Any) -> None:
    model = SlowDemo(step=0.0)
    web = await start_web(settings_for(tmp_path), provider=model)
    spy = StoreSpy(web.app.store)
    outcomes: dict[str, dict[str, int]] = {t: {"stopped": 0, "done": 0} for t in TIMINGS}
    try:
        sse = await web.stream()
        for i in range(RACES):
            timing = TIMINGS[i % len(TIMINGS)]
            model.gate = asyncio.Event()
            spy.arm(hold=timing == "during_store")
            sid = await web.new_session()
            accepted = await web.say(sid, f"race {i}")
            stream_id = accepted["stream_id"]
            stop: asyncio.Task[Any]

            async def stop_now(sid: str = sid) -> bool:
                r = await web.post(f"/api/sessions/{sid}/stop")
                return bool((await r.json())["stopped"])

            if timing == "before_end":
                stop = asyncio.create_task(stop_now())
                await asyncio.wait([stop])
                model.gate.set()
            elif timing == "at_end":
                model.gate.set()
                await asyncio.sleep(0.001 * (i % 7))
                stop = asyncio.create_task(stop_now())
            elif timing == "during_store":
                model.gate.set()
                await spy.entered.wait()
                stop = asyncio.create_task(stop_now())
                await asyncio.sleep(0.005 * (i % 5))
                spy.proceed.set()
            else:
                model.gate.set()
                await spy.done.wait()
                stop = asyncio.create_task(stop_now())
            stopped = await stop
            end = await sse.wait_for(
                lambda e, s=stream_id: e[1] == "turn.end" and e[2]["stream_id"] == s, timeout=20
            )
            replies = [m for m in (await web.session(sid))["items"] if m["role"] == "assistant"]
            status = end[2]["status"]
            assert status == ("stopped" if stopped else "done"), (timing, stopped, status)
            assert len(replies) == 1, (timing, stopped, replies)
            assert bool(replies[0].get("stopped")) == stopped, (timing, replies)
            outcomes[timing][status] += 1
        await sse.close()
    finally:
        await stop_web(web)
    print(f"\nweb UI stop/store races: {RACES} ran; by timing: {outcomes}")
    assert outcomes["before_end"]["stopped"] > 0
    assert outcomes["after_store"]["done"] > 0
