"""The Deliveries page searches the whole ledger, not only its newest 200 rows.

A search used to filter the newest 200 rows in memory, so an older row could not be found
by its id, its session or a word of its goal at all. Now an id is looked up by the primary
key, a session through the ledger's session indexes (routing key, API and web UI origin
ids) and a goal's words through its text index (``RowQuery.text``), however old the row.
"""

from __future__ import annotations

import asyncio
from urllib.parse import quote

import tools.async_delegation as ad
from delivery.ledger import Ledger
from tests.webui.conftest import Web


def _fill(ledger: Ledger, n: int) -> None:
    ledger.create(
        "deleg_oldest0001",
        kind="delegation",
        origin_ui_session_id="sess_findme",
        goal="the first job ever: nightly backup of /srv/data",
    )
    for i in range(n):
        ledger.create(f"deleg_newer{i:05d}", kind="delegation", goal=f"job {i}")


async def _search(web: Web, q: str, state: str = "") -> list[str]:
    query = f"/api/deliveries?q={quote(q)}" + (f"&state={state}" if state else "")
    response = await web.get(query)
    assert response.status == 200, await response.text()
    return [d["id"] for d in (await response.json())["deliveries"]]


async def test_an_old_row_is_found_by_its_id_and_its_session(web: Web) -> None:
    ledger: Ledger = ad.get_runtime().ledger
    await asyncio.to_thread(_fill, ledger, 250)
    assert await _search(web, "deleg_oldest0001") == ["deleg_oldest0001"]
    assert await _search(web, "sess_findme") == ["deleg_oldest0001"]
    assert await _search(web, "sess_findme", "pending") == ["deleg_oldest0001"]
    assert await _search(web, "sess_findme", "dropped") == []
    assert await _search(web, "job 249") == ["deleg_newer00249"]
    assert await _search(web, "nothing-like-it") == []


async def test_the_oldest_row_is_found_by_a_word_of_its_goal(web: Web) -> None:
    ledger: Ledger = ad.get_runtime().ledger
    await asyncio.to_thread(_fill, ledger, 300)
    assert await _search(web, "backup") == ["deleg_oldest0001"]
    assert await _search(web, "Nightly BACK") == ["deleg_oldest0001"]  # prefixes, any case
    assert await _search(web, "data first") == ["deleg_oldest0001"]
    assert await _search(web, "backup", "pending") == ["deleg_oldest0001"]
    assert await _search(web, "backup", "delivered") == []
    newest = await _search(web, "job")
    assert len(newest) == 200 and newest[0] == "deleg_newer00299"  # the page's limit


async def test_what_is_typed_is_searched_as_words_never_an_error(web: Web) -> None:
    ledger: Ledger = ad.get_runtime().ledger
    await asyncio.to_thread(_fill, ledger, 3)
    for typed in ('"backup', "backup*", "(backup", "-backup", "backup:*", "backup'; --"):
        assert await _search(web, typed) == ["deleg_oldest0001"], typed
    for typed in ("NEAR(backup", "backup OR nightly", "NOT backup"):  # words no goal holds
        assert await _search(web, typed) == [], typed
    for typed in (
        '"',
        "*",
        "-",
        "()",
        "\\",
        "%ED%A0%80",
        "x" * 8_000,
    ):  # the request line tops out at 8 KiB
        assert await _search(web, typed) == [], typed
    # Bytes that are no UTF-8 (an encoded lone surrogate, 0xFF) around a word of the goal
    response = await web.get("/api/deliveries?q=%ED%B2%80backup%FF")
    assert response.status == 200, await response.text()
    assert [d["id"] for d in (await response.json())["deliveries"]] == ["deleg_oldest0001"]
