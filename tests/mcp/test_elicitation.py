"""Form elicitation from a real SDK server (``form_server.py`` over stdio) through the call's
confirmation hook, the way a yes/no surface (a Telegram keyboard, a web UI card) answers it:
a yes accepts with the schema's defaults, a form a yes cannot fill (a required field without
a default) is declined after a bare yes, a no or an expired approval declines. And the form
itself: the fields Reveille reads, the answers it checks."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.tools import ApprovalExpired, ToolContext, ToolRegistry
from tests.mcp.form_server import PROFILE, SIGNUP
from tools.mcp.config import McpServerConfig
from tools.mcp.elicitation import FormError, parse_form
from tools.mcp.manager import McpClients

FORMS = Path(__file__).with_name("form_server.py")

PROFILE_DEFAULTS = {"age": 36, "color": "green", "name": "Ada", "score": 9.5, "subscribed": True}


@pytest.fixture
async def registry() -> AsyncIterator[ToolRegistry]:
    clients = McpClients()
    config = McpServerConfig(name="forms", command=(sys.executable, str(FORMS)))
    await clients.start([config], min_backoff=0.05)
    made = ToolRegistry()
    clients.attach(made)
    yield made
    await clients.stop()


async def call(registry: ToolRegistry, tool: str, **ctx: object) -> str:
    return await registry.call(f"forms__{tool}", "{}", ToolContext(**ctx))  # type: ignore[arg-type]


async def test_a_yes_accepts_the_forms_defaults(registry) -> None:
    asked: list[str] = []

    async def confirm(text: str) -> bool:
        asked.append(text)
        return True

    answer = await call(registry, "profile", confirm=confirm)
    assert answer == "accept " + json.dumps(PROFILE_DEFAULTS, sort_keys=True)
    assert asked == [
        "MCP server forms asks: Your profile?\n"
        '- name (string, required): Your name [default "Ada"]\n'
        "- age (integer) [default 36]\n"
        "- score (number) [default 9.5]\n"
        '- color (one of red/green/blue) [default "green"]\n'
        "- subscribed (boolean) [default true]"
    ]


async def test_a_bare_yes_declines_a_form_it_cannot_fill(registry) -> None:
    """Asked (the API and the CLI can answer with values: test_elicitation_answers.py), but
    a plain yes has nothing to put in a required field without a default."""
    asked: list[str] = []

    async def confirm(text: str) -> bool:
        asked.append(text)
        return True

    assert await call(registry, "signup", confirm=confirm) == "decline null"
    assert asked and asked[0].startswith("MCP server forms asks: Sign up?\n- email (string")


async def test_a_no_and_an_expiry_decline(registry) -> None:
    async def no(text: str) -> bool:
        return False

    async def expired(text: str) -> bool:
        raise ApprovalExpired("appr_x")

    assert await call(registry, "profile", confirm=no) == "decline null"
    assert await call(registry, "profile", confirm=expired) == "decline null"
    assert await call(registry, "profile") == "decline null"  # nobody to ask


def test_answers_are_checked_and_completed_with_defaults() -> None:
    form = parse_form("Sign up?", SIGNUP)
    assert form.yes_answer() is None
    assert form.answer({"email": "a@b.c", "seats": 3.0}) == {
        "email": "a@b.c",
        "plan": "free",
        "seats": 3,
    }
    for values, error in [
        ({}, "field 'email' is required"),
        ({"email": "a@b.c", "plan": "gold"}, "field 'plan' takes one of free, pro"),
        ({"email": "a@b.c", "seats": 2.5}, "field 'seats' takes an integer"),
        ({"email": "a@b.c", "seats": True}, "field 'seats' takes a number"),
        ({"email": 7}, "field 'email' takes a string"),
        ({"email": "a@b.c", "admin": True}, "unknown field"),
    ]:
        with pytest.raises(FormError, match=error):
            form.answer(values)


def test_schemas_outside_the_flat_subset_are_refused() -> None:
    nested = {"properties": {"address": {"type": "object"}}}
    with pytest.raises(FormError, match="type 'object' is not a form field's"):
        parse_form("Where?", nested)
    # A default the field refuses is left out, not sent back.
    odd = parse_form("?", {"properties": {"n": {"type": "integer", "default": "x"}}})
    assert odd.yes_answer() == {}
    assert parse_form("?", PROFILE).yes_answer() == PROFILE_DEFAULTS
