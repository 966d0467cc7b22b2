"""The Deliveries page searches the whole ledger, not only its newest 200 rows.

A search used to filter the newest 200 rows in memory, so an older row could not be found
by its id or its session at all. Now an id is looked up by the primary key and a session
through the ledger's session indexes (routing key, API and web UI origin ids), however old
the row; a word of a goal still matches among the newest rows.
"""

from __future__ import annotations

import asyncio

import tools.async_delegation as ad
from delivery.ledger import Ledger
from tests.webui.conftest import Web


def _fill(ledger: Ledger, n: int) -> None:
    ledger.create(
        "deleg_oldest0001",
        kind="delegation",
        origin_ui_session_id="sess_findme",
        goal="the first job ever",
    )
    for i in range(n):
        ledger.create(f"deleg_newer{i:05d}", kind="delegation", goal=f"job {i}")


async def _search(web: Web, q: str, state: str = "") -> list[str]:
    query = f"/api/deliveries?q={q}" + (f"&state={state}" if state else "")
    return [d["id"] for d in (await (await web.get(query)).json())["deliveries"]]


async def test_an_old_row_is_found_by_its_id_and_its_session(web: Web) -> None:
    ledger: Ledger = ad.get_runtime().ledger
    await asyncio.to_thread(_fill, ledger, 250)
    assert await _search(web, "deleg_oldest0001") == ["deleg_oldest0001"]
    assert await _search(web, "sess_findme") == ["deleg_oldest0001"]
    assert await _search(web, "sess_findme", "pending") == ["deleg_oldest0001"]
    assert await _search(web, "sess_findme", "dropped") == []
    assert await _search(web, "job 249") == ["deleg_newer00249"]  # a goal's words: newest
    assert await _search(web, "nothing-like-it") == []
