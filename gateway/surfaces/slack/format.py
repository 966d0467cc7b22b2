"""Slack message text: the model's markdown as Slack's ``mrkdwn``, split at 4,000 characters.

Slack never refuses a message for its markup, but it reads three characters as control
characters everywhere (code included): ``&``, ``<`` and ``>`` start an entity, a link or a
mention (``<!channel>`` pings everyone). ``to_mrkdwn`` escapes them as Slack asks
(``&amp;``, ``&lt;``, ``&gt;``) in every piece of text the model wrote, so model output can
neither ping anyone nor open a link it did not write as one, and then rewrites the markdown
Slack spells differently (outside code):

* ``**bold**`` / ``__bold__`` -> ``*bold*``; ``*italic*`` / ``_italic_`` -> ``_italic_``;
  ``~~struck~~`` -> ``~struck~``; a heading (``# Title``) -> ``*Title*``;
* ``[text](url)`` -> ``<url|text>`` for an ``http(s)``/``mailto`` URL; any other URL
  (``javascript:``...) stays visible text, ``text (url)``, never a link; an image likewise;
* inline code and fenced blocks keep their backticks (a fence's language is dropped: Slack
  shows it as text).

``split_message`` rewrites first and then cuts, so each piece is at most
``MAX_MESSAGE_LENGTH`` characters as sent (Slack's advice for ``text``): at paragraph
boundaries where it can, never inside an entity or a link, a fenced block cut by a split
closed and opened again so each piece renders alone.
"""

from __future__ import annotations

import re

__all__ = ["MAX_MESSAGE_LENGTH", "escape", "split_message", "to_mrkdwn"]

MAX_MESSAGE_LENGTH = 4000

_FENCE = re.compile(r"^\s*```")
_CODE_SPAN = re.compile(r"(`[^`\n]+`)")
_LINK = re.compile(r"!?\[([^\]\n]*)\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$")
_BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*|__(?=\S)(.+?)(?<=\S)__")
_ITALIC = re.compile(r"(?<![\w*])\*(?=[^\s*])([^*\n]+?)(?<=[^\s*])\*(?![\w*])")
_STRIKE = re.compile(r"~~(?=\S)(.+?)(?<=\S)~~")
_SAFE_URL = re.compile(r"^(https?://|mailto:)[^\s<>|]+$", re.IGNORECASE)
_BOLD_MARK = "\x00"  # stands for a bold ``*`` while single ``*`` become ``_``
_LINK_MARK = "\x01"  # stands for a link already written, while the prose around it is
_BOUNDARIES = ("\n\n", "\n", " ")
_CLOSE = "\n```"


def escape(text: str) -> str:
    """``text`` with Slack's three control characters escaped (its own rule, in this order)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _link(label: str, url: str) -> str:
    label = label or "image"
    if _SAFE_URL.match(url):
        return f"<{escape(url)}|{escape(label)}>"
    return escape(f"{label} ({url})")


def _prose(text: str) -> str:
    """A piece of text outside code: escaped, then its markdown spelled as mrkdwn."""
    links: list[str] = []

    def keep(m: re.Match[str]) -> str:
        links.append(_link(m.group(1), m.group(2)))
        return _LINK_MARK

    text = escape(_LINK.sub(keep, text.replace(_BOLD_MARK, "").replace(_LINK_MARK, "")))
    text = _BOLD.sub(lambda m: f"{_BOLD_MARK}{m.group(1) or m.group(2)}{_BOLD_MARK}", text)
    text = _ITALIC.sub(lambda m: f"_{m.group(1)}_", text)
    text = _STRIKE.sub(lambda m: f"~{m.group(1)}~", text).replace(_BOLD_MARK, "*")
    parts = text.split(_LINK_MARK)
    return "".join(p + (links[i] if i < len(links) else "") for i, p in enumerate(parts))


def _line(line: str) -> str:
    heading = _HEADING.match(line)
    if heading:
        return f"*{escape(heading.group(1).replace('*', ''))}*"
    pieces = _CODE_SPAN.split(line)
    # Odd pieces are code spans: escaped only.
    return "".join(escape(p) if i % 2 else _prose(p) for i, p in enumerate(pieces))


def to_mrkdwn(markdown: str) -> str:
    """``markdown`` as Slack mrkdwn (see the module docstring)."""
    out: list[str] = []
    fenced = False
    for line in markdown.split("\n"):
        if _FENCE.match(line):
            fenced = not fenced
            out.append("```")
        elif fenced:
            out.append(escape(line))
        else:
            out.append(_line(line))
    return "\n".join(out)


def _fence_open(text: str) -> bool:
    return sum(1 for line in text.split("\n") if line == "```") % 2 == 1


def _cut(text: str, limit: int) -> int:
    """Where to end the next piece (> 0): the last boundary within ``limit`` that is not
    inside a link (``<...>``); else ``limit``, moved back off an entity (``&...;``)."""
    if len(text) <= limit:
        return len(text)
    for boundary in _BOUNDARIES:
        at = text.rfind(boundary, 0, limit)
        while at > 0 and text.rfind("<", 0, at) > text.rfind(">", 0, at):
            at = text.rfind(boundary, 0, text.rfind("<", 0, at))
        if at > 0:
            return at
    at = limit
    amp = text.rfind("&", max(0, at - 6), at)
    if amp > 0 and ";" not in text[amp:at]:
        at = amp
    opened = text.rfind("<", 0, at)
    if opened > 0 and opened > text.rfind(">", 0, at):
        at = opened
    return at


def split_message(text: str, limit: int = MAX_MESSAGE_LENGTH) -> list[str]:
    """``text`` as mrkdwn (``to_mrkdwn``) in pieces of at most ``limit`` characters, fences
    balanced in each; never an empty list."""
    pieces: list[str] = []
    rest = to_mrkdwn(text)
    reopen = ""
    while True:
        rest = reopen + rest
        if len(rest) <= limit and not _fence_open(rest):
            pieces.append(rest)
            return pieces
        budget = limit - len(_CLOSE)
        at = _cut(rest, budget)
        if at <= len(reopen):
            at = max(budget, len(reopen) + 1)
        piece, rest = rest[:at], rest[at:]
        for boundary in _BOUNDARIES:
            if rest.startswith(boundary):
                rest = rest[len(boundary) :]
                break
        if _fence_open(piece):
            piece += _CLOSE
            reopen = "```\n"
        else:
            reopen = ""
        pieces.append(piece)
        if not rest.strip():
            return pieces
