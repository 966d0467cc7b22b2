"""Discord message text: the model's markdown as Discord renders it, split at 2,000 characters.

Discord renders markdown itself and never refuses a message for its markup, so what can go
wrong is what a reader sees, not a parse error:

* A fenced code block cut by a split would leave the next message rendered as code up to
  the following fence. ``split_message`` closes a fence open at the end of a piece and opens
  it again (with its language) at the start of the next one, so each piece renders alone.
* What Discord does not render, ``to_discord`` rewrites (outside code blocks only): headings
  deeper than ``###`` become bold, a table (``| a | b |`` rows with a ``|---|`` line) goes
  into a code block so its columns stay aligned, and an image (``![alt](url)``) becomes a
  link.
* Mentions (``@everyone``, ``<@id>``, ``<@&role>``) in model output must not ping anyone;
  that is not done in the text but by sending every message with no allowed mentions.

Discord counts a message's length in characters (code points); ``split_message`` rewrites
first and then cuts, so each piece is at most ``MAX_MESSAGE_LENGTH`` of them as sent. Pieces
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


_TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")
_IMAGE = re.compile(r"!\[([^\]\n]*)\]\(([^)\s]+)\)")


def _is_row(line: str) -> bool:
    return line.lstrip().startswith("|") and line.rstrip().endswith("|")


def _prose(line: str) -> str:
    line = _DEEP_HEADING.sub(lambda m: f"**{m.group(1)}**", line)
    return _IMAGE.sub(lambda m: f"[{m.group(1) or 'image'}]({m.group(2)})", line)


def to_discord(markdown: str) -> str:
    """``markdown`` as Discord shows it well (see the module docstring). Applied twice it
    changes nothing more, so a piece already rewritten may be passed through it again."""
    lines = markdown.split("\n")
    out: list[str] = []
    fenced = False
    i = 0
    while i < len(lines):
        line = lines[i]
        if _FENCE.match(line):
            fenced = not fenced
            out.append(line)
            i += 1
            continue
        if fenced:
            out.append(line)
            i += 1
            continue
        # A table: a header row, its rule, and the rows after it.
        if _is_row(line) and i + 1 < len(lines) and _TABLE_RULE.match(lines[i + 1]):
            end = i + 2
            while end < len(lines) and _is_row(lines[end]):
                end += 1
            out.append("```")
            out.extend(row.replace("```", "`\u200b``") for row in lines[i:end])
            out.append("```")
            i = end
            continue
        out.append(_prose(line))
        i += 1
    return "\n".join(out)


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
    """``text`` rewritten for Discord (``to_discord``) in pieces of at most ``limit``
    characters, fences balanced in each; never an empty list."""
    pieces: list[str] = []
    rest = to_discord(text)
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
