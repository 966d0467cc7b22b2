"""The approval question as markdown, the same words on every markdown chat platform.

Discord, Matrix and Slack each ask a person with this text plus their own buttons or
reactions; only how a command is fenced differs (Discord cannot lengthen a fence, so it
breaks the command's own backticks instead), so the fence is the caller's.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.approvals import ApprovalRecord

__all__ = ["fenced", "question_markdown"]


def fenced(text: str) -> str:
    """``text`` in a fence longer than any run of backticks inside it: nothing in the
    command can close the block early."""
    ticks = "```"
    while ticks in text:
        ticks += "`"
    return f"{ticks}\n{text}\n{ticks}"


def question_markdown(approval: ApprovalRecord, fence: Callable[[str], str] = fenced) -> str:
    """What a person is asked (or told, once the question expired), the command fenced."""
    if approval.status == "expired":
        return (
            "**Approval expired.** Nobody answered, so the background task "
            f"`{approval.unit_id}` did not run:\n{fence(approval.command)}"
        )
    what = (
        f"A background task (`{approval.unit_id}`) wants to run"
        if approval.background
        else "The agent wants to run"
    )
    return f"**Approval needed.** {what}:\n{fence(approval.command)}"
