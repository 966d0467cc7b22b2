"""Discord message text: the model's markdown as Discord renders it, split at 2,000 characters.

Discord renders markdown itself and never refuses a message for its markup, so what can go
wrong is what a reader sees, not a parse error:

* A fenced code block cut by a split would leave the next message rendered as code up to
  the following fence. ``split_message`` closes a fence open at the end of a piece and opens
  it again (with its language) at the start of the next one, so each piece renders alone.
* Headings deeper than ``###`` are not Discord markdown: ``to_discord`` makes them bold.
* Mentions (``@everyone``, ``<@id>``, ``<@&role>``) in model output must not ping anyone;
  that is not done in the text but by sending every message with no allowed mentions.

Discord counts a message's length in characters (code points); a piece is at most
``MAX_MESSAGE_LENGTH`` of them after ``to_discord`` (which never makes text longer). Pieces
break at paragraph boundaries where they can, then at line ends, then at spaces, and only
as a last resort inside a word.
"""

from __future__ import annotations

import re

__all__ = ["MAX_MESSAGE_LENGTH", "code_block", "split_message", "to_discord"]

MAX_MESSAGE_LENGTH = 2000

_BOUNDARIES = ("\n\n", "\n", " ")
_FENCE = re.compile(r"^\s*```(\S*)", re.MULTILINE)
_DEEP_HEADING = re.compile(r"^#{4,6}[ \t]+(.+?)[ \t#]*$", re.MULTILINE)
_CLOSE = "\n```"


def to_discord(markdown: str) -> str:
    """``markdown`` as Discord shows it well (see the module docstring); never longer."""
    return _DEEP_HEADING.sub(lambda m: f"**{m.group(1)}**", markdown)


def code_block(text: str) -> str:
    """``text`` as a fenced block that nothing in it can close early."""
    return "```\n" + text.replace("```", "`\u200b``") + "\n```"


def _open_fence(text: str) -> str | None:
    """The opening line (```` ```lang ````) of a fence still open at the end of ``text``."""
    opening: str | None = None
    for m in _FENCE.finditer(text):
        opening = None if opening is not None else "```" + m.group(1)
    return opening


def _cut(text: str, limit: int) -> int:
    """Where to end the next piece of ``text`` (> 0): the last boundary within ``limit``."""
    if len(text) <= limit:
        return len(text)
    for boundary in _BOUNDARIES:
        at = text.rfind(boundary, 0, limit)
        if at > 0:
            return at
    return limit


def split_message(text: str, limit: int = MAX_MESSAGE_LENGTH) -> list[str]:
    """``text`` in pieces of at most ``limit`` characters, fences balanced in each; never
    an empty list."""
    pieces: list[str] = []
    rest = text
    reopen = ""  # the fence the previous piece closed, opened again here
    while True:
        rest = reopen + rest
        if len(rest) <= limit and _open_fence(rest) is None:
            pieces.append(rest)
            return pieces
        # Room for closing a fence this piece may leave open.
        budget = limit - len(_CLOSE)
        at = _cut(rest, budget)
        if at <= len(reopen):  # a fence line alone does not fit: cut inside the text
            at = max(budget, len(reopen) + 1)
        piece, rest = rest[:at], rest[at:]
        for boundary in _BOUNDARIES:  # the boundary cut at belongs to neither piece
            if rest.startswith(boundary):
                rest = rest[len(boundary) :]
                break
        opening = _open_fence(piece)
        if opening is not None:
            piece += _CLOSE
            reopen = opening + "\n"
        else:
            reopen = ""
        pieces.append(piece)
        if not rest.strip():
            return pieces
