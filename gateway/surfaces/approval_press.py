"""A press on an approval's button, decided the same way on every chat platform.

The adapter turns its platform's button press (a Telegram callback query, a Discord
interaction) into an ``ApprovalPress`` and shows the ``PressAnswer`` it gets back. The rule
lives here once: only the owner of the approval's conversation decides (``is_owner``: the
private chat's user, or the user who started a group's session), and only in the chat the
question was asked in, once, through ``gateway.approvals`` (the store). Anyone else is told
"not yours", a second press "already decided", a press whose turn is gone (a restart) that
it was settled as denied ("already decided: denied" once a new turn took the session over,
which denies what the dead one asked), else "expired" (this press settles it).
"""

from __future__ import annotations

import asyncio

from gateway.approvals import AlreadyDecided, Approvals, Expired
from gateway.session import SessionSource, SessionStore
from gateway.surfaces.port import ApprovalPress, ChatSurface, PressAnswer, is_owner

__all__ = ["NOT_YOURS", "decide_press"]

NOT_YOURS = "Not yours to decide."
_EXPIRED_BACKGROUND = "Expired: nobody answered in time, or its task stopped; nothing ran."


def _code(command: str) -> str:
    """``command`` as an inline code span, whatever backticks it holds."""
    if "`" not in command:
        return f"`{command}`"
    # A span cannot hold its own fence: the command as it is, which the adapter escapes.
    return command


async def decide_press(
    surface: ChatSurface,
    store: SessionStore,
    approvals: Approvals | None,
    press: ApprovalPress,
    *,
    allowed_users: frozenset[str],
) -> PressAnswer:
    """Decide ``press`` if its presser may, and say what came of it (module docstring)."""
    if approvals is None or press.user_id not in allowed_users:
        return PressAnswer(NOT_YOURS)
    record = await asyncio.to_thread(store.get_approval, press.approval_id)
    session = (
        await asyncio.to_thread(store.get_session, record.session_id)
        if record is not None
        else None
    )
    if record is None or session is None or not isinstance(session.source, dict):
        return PressAnswer("Unknown approval.")
    source = SessionSource.from_dict(session.source)
    if (
        source.platform is not surface.platform
        or source.chat_id != press.chat_id
        or not is_owner(surface, source, press.user_id)
    ):
        return PressAnswer(NOT_YOURS)
    command = _code(record.command)
    try:
        await approvals.decide(
            press.approval_id,
            press.approve,
            by=f"{surface.platform.value.capitalize()} user {press.user_id}",
        )
    except Expired as exc:
        if exc.record.background:
            return PressAnswer(_EXPIRED_BACKGROUND, f"Expired (not run): {command}")
        return PressAnswer(
            "Expired: the turn that asked it is gone (a restart). Ask again.",
            f"Expired (not run): {command}",
        )
    except (AlreadyDecided, KeyError):
        settled = await asyncio.to_thread(store.get_approval, press.approval_id)
        if settled is not None and settled.status == "approved":
            return PressAnswer("Already decided: approved.")
        if settled is not None and settled.status == "expired":
            return PressAnswer(_EXPIRED_BACKGROUND, f"Expired (not run): {command}")
        # Denied by a person, or when its turn ended (a restart took the session over).
        return PressAnswer(
            "Already decided: denied (by you, or because its turn ended); nothing ran.",
            f"Denied (not run): {command}",
        )
    if press.approve:
        return PressAnswer("Approved.", f"Approved once: {command}")
    return PressAnswer("Denied.", f"Denied (not run): {command}")
