"""Discord's face of approvals: the buttons a command is asked with, and their presses.

A question is a message with two buttons (Approve once / Deny) whose ``custom_id`` is
``reveille:appr:<approval id>:y|n``: the approval's opaque id, never the command. A press
arrives as an interaction (a message component) and becomes an ``ApprovalPress`` decided by
``gateway.surfaces.approval_press.decide_press``: the owner of the conversation only, once.
A press that decided answers by updating the question (its buttons taken away); any other
(not yours, already decided) is answered to the presser alone (an ephemeral reply).

The view is only the buttons' layout: it is stopped as soon as the question is sent, so
discord.py keeps no per-message state; presses are taken by ``custom_id`` in
``on_interaction``, which works the same after a restart.
"""

from __future__ import annotations

import discord

from gateway.approvals import ApprovalRecord
from gateway.surfaces.approval_text import question_markdown
from gateway.surfaces.discord.format import code_block
from gateway.surfaces.port import ApprovalPress

__all__ = ["APPROVAL_PREFIX", "approval_view", "parse_press", "question_text"]

APPROVAL_PREFIX = "reveille:appr:"


def question_text(approval: ApprovalRecord) -> str:
    """The question's markdown (the command in a block nothing in it can close)."""
    return question_markdown(approval, code_block)


def approval_view(approval_id: str) -> discord.ui.View:
    """The two buttons of a question."""
    view = discord.ui.View(timeout=None)
    view.add_item(
        discord.ui.Button(
            style=discord.ButtonStyle.success,
            label="Approve once",
            custom_id=f"{APPROVAL_PREFIX}{approval_id}:y",
        )
    )
    view.add_item(
        discord.ui.Button(
            style=discord.ButtonStyle.danger,
            label="Deny",
            custom_id=f"{APPROVAL_PREFIX}{approval_id}:n",
        )
    )
    return view


def parse_press(custom_id: str, user_id: str, chat_id: str) -> ApprovalPress | None:
    """The press a button's ``custom_id`` stands for; None when it is not an approval's."""
    if not custom_id.startswith(APPROVAL_PREFIX) or custom_id[-2:] not in (":y", ":n"):
        return None
    approval_id = custom_id[len(APPROVAL_PREFIX) : -2]
    if not approval_id:
        return None
    return ApprovalPress(approval_id, custom_id.endswith(":y"), user_id, chat_id)
