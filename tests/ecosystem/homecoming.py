"""What the ecosystem tests check on the server's side after a client's agent ran: the
background sub-agent's result came home to the conversation's session exactly once."""

from __future__ import annotations

from typing import Any

from delivery.rows import LedgerRow
from gateway.wake import DELEGATION_DISPLAY_KIND
from tests.api_server.serve_support import Server, call, ledger_rows, transcript, wait_until
from tests.ecosystem.fake_model import SUB_AGENT_ANSWER, AgentModel


def the_session(server: Server) -> str:
    """The id of the one conversation the server holds (each test has a server of its own)."""
    status, _, data = call(server.port, "GET", "/api/sessions")
    assert status == 200, data
    [session] = data["data"]
    return str(session["id"])


def delegation_rows(server: Server, session_id: str) -> list[dict[str, Any]]:
    rows = transcript(server.port, session_id)
    return [m for m in rows if m["display_kind"] == DELEGATION_DISPLAY_KIND]


def wait_for_the_result(server: Server, session_id: str) -> None:
    """Until the sub-agent's result is in the session's transcript."""
    wait_until(lambda: delegation_rows(server, session_id))


def came_home_once(server: Server, session_id: str, model: AgentModel) -> None:
    """One delegation, its result in the transcript once and folded into a turn once (the
    model's latest context holds it once), and its ledger row delivered (nothing pending,
    nothing doubled)."""
    [result] = delegation_rows(server, session_id)
    assert SUB_AGENT_ANSWER in result["content"] and result["folded"], result
    context = model.requests[-1]["messages"]
    assert sum(SUB_AGENT_ANSWER in str(m.get("content")) for m in context) == 1, context

    def settled() -> list[LedgerRow]:
        rows = ledger_rows(server.home)
        return rows if rows and all(r.delivery_state == "delivered" for r in rows) else []

    [row] = [r for r in wait_until(settled) if r.kind == "delegation"]
    assert row.goal == "count the stars"
