"""Slack's face of approvals: the question as Block Kit (its text and two buttons).

The question is a message whose blocks are the question's mrkdwn (a ``section``) and an
``actions`` block of two buttons, "Approve once" (``reveille_approve``) and "Deny"
(``reveille_deny``), each carrying the approval's opaque id as its ``value``, never the
command. A press comes back as a ``block_actions`` payload (``intake.press_of``): over Socket
Mode as an ``interactive`` envelope, or POSTed to the interactivity URL. An expired
approval is said without buttons.
"""

from __future__ import annotations

from agent.messages import JSONObject
from gateway.approvals import ApprovalRecord
from gateway.surfaces.approval_text import question_markdown
from gateway.surfaces.slack.intake import APPROVE_ACTION, DENY_ACTION

__all__ = ["question_blocks", "question_text"]

# Slack's limit on a section block's text.
_SECTION_CHARS = 3000


def question_text(approval: ApprovalRecord) -> str:
    """The question's markdown (the command in a block nothing in it can close)."""
    return question_markdown(approval)


def _button(label: str, action_id: str, value: str, style: str) -> JSONObject:
    return {
        "type": "button",
        "text": {"type": "plain_text", "text": label},
        "action_id": action_id,
        "value": value,
        "style": style,
    }


def question_blocks(approval: ApprovalRecord, mrkdwn: str) -> list[JSONObject]:
    """The question's blocks: its text (``mrkdwn``, cut to a section's limit) and, unless it
    expired, the two buttons."""
    text = mrkdwn if len(mrkdwn) <= _SECTION_CHARS else mrkdwn[: _SECTION_CHARS - 1] + "…"
    blocks: list[JSONObject] = [{"type": "section", "text": {"type": "mrkdwn", "text": text}}]
    if approval.status != "expired":
        blocks.append(
            {
                "type": "actions",
                "elements": [
                    _button("Approve once", APPROVE_ACTION, approval.id, "primary"),
                    _button("Deny", DENY_ACTION, approval.id, "danger"),
                ],
            }
        )
    return blocks
