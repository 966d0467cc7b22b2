"""Telegram message text: the model's markdown as ``parse_mode=HTML``, and splitting.

``to_html`` turns the markdown models write into the HTML subset Telegram takes: bold,
italic, strikethrough, inline code, fenced code blocks (with their language), links
(http, https, tg and mailto only) and headings (bold); list items keep their numbers or get
a bullet. Everything else a model writes is escaped text: every ``<``, ``>`` and ``&``
outside the tags made here is escaped, a tag is only ever emitted with its closing tag,
and markdown that does not pair up (a lone ``**``, an unclosed code fence) stays literal
text or runs to the end of the piece, so the result is always well-formed HTML that
Telegram accepts. (Should Telegram still answer "can't parse entities", the adapter sends
the piece again as plain text.)

Telegram allows 4,096 characters per message (counted after entity parsing, in UTF-16 code
units); a longer reply is split into several messages (raw markdown, converted piece by
piece), at paragraph boundaries where it can be, then at line ends, then at spaces, and only
as a last resort inside a word. A piece is measured escaped, which is never shorter than
what Telegram counts once the markup is parsed, so no piece goes over the limit.
"""

from __future__ import annotations

import html
import re

__all__ = ["MAX_MESSAGE_LENGTH", "escape", "split_message", "to_html", "utf16_len"]

MAX_MESSAGE_LENGTH = 4096

# Tried in order: a paragraph break, a line break, a space.
_BOUNDARIES = ("\n\n", "\n", " ")


def escape(text: str) -> str:
    """``text`` as literal HTML-mode text (quotes need no escaping outside attributes)."""
    return html.escape(text, quote=False)


def utf16_len(text: str) -> int:
    """The length Telegram counts: UTF-16 code units (an emoji outside the BMP counts two)."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _fits(piece: str, limit: int) -> bool:
    return utf16_len(escape(piece)) <= limit


def _longest_prefix(text: str, limit: int) -> int:
    """The length of the longest prefix of ``text`` that fits (at least one character)."""
    lo, hi = 1, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _fits(text[:mid], limit):
            lo = mid
        else:
            hi = mid - 1
    return lo


def split_message(text: str, limit: int = MAX_MESSAGE_LENGTH) -> list[str]:
    """``text`` in pieces that each fit one message once escaped; never an empty list.

    Pieces are raw (unescaped) text; joining them with the separators they were cut at
    gives ``text`` back (separators at a cut are dropped, nothing else is lost).
    """
    if limit < 8:
        raise ValueError("limit is too small to split on")
    if not text.strip():
        return [text or "…"]
    pieces: list[str] = []
    rest = text
    while rest:
        if _fits(rest, limit):
            pieces.append(rest)
            break
        room = _longest_prefix(rest, limit)
        cut = -1
        sep_len = 0
        for sep in _BOUNDARIES:
            # An occurrence starting at or before ``room`` leaves a prefix that fits.
            at = rest.rfind(sep, 0, room + len(sep))
            # A cut that leaves less than a quarter of the room is not worth it.
            if at > room // 4:
                cut, sep_len = at, len(sep)
                break
        if cut <= 0:
            cut, sep_len = room, 0
        piece = rest[:cut]
        if piece.strip():
            pieces.append(piece)
        rest = rest[cut + sep_len :]
    return pieces or ["…"]


# --------------------------------------------------------------------------- markdown

_FENCE = re.compile(r"^```[ \t]*([A-Za-z0-9_+#.-]*)[^\n]*\n(.*?)(?:^```[ \t]*$|\Z)", re.M | re.S)
_INLINE = re.compile(
    r"(?P<code>`(?P<code_body>[^`\n]+)`)"
    r"|(?P<link>\[(?P<link_text>[^\]\n]+)\]\((?P<link_url>[^()\s]+)\))"
    r"|(?P<bold>\*\*(?=\S)(?P<bold_body>.+?)(?<=\S)\*\*)"
    r"|(?P<bold2>(?<![\w_])__(?=\S)(?P<bold2_body>.+?)(?<=\S)__(?![\w_]))"
    r"|(?P<strike>~~(?=\S)(?P<strike_body>.+?)(?<=\S)~~)"
    r"|(?P<italic>(?<![\w*])\*(?=[^\s*])(?P<italic_body>[^*\n]+?)(?<=[^\s*])\*(?![\w*]))"
    r"|(?P<italic2>(?<![\w_])_(?=[^\s_])(?P<italic2_body>[^_\n]+?)(?<=[^\s_])_(?![\w_]))"
)
_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$")
_BULLET = re.compile(r"^([ \t]*)[-*+][ \t]+(.*)$")
_SAFE_URL = re.compile(r"^(https?://|tg://|mailto:)[^\s\"<>]+$", re.I)
_TAGS = {"bold": "b", "bold2": "b", "strike": "s", "italic": "i", "italic2": "i"}


def _inline(text: str) -> str:
    """One line of markdown as HTML: matched pairs become tags, the rest is escaped."""
    out: list[str] = []
    at = 0
    for m in _INLINE.finditer(text):
        out.append(escape(text[at : m.start()]))
        at = m.end()
        kind = m.lastgroup
        if kind == "code":
            out.append(f"<code>{escape(m.group('code_body'))}</code>")
        elif kind == "link":
            url = m.group("link_url")
            label = _inline(m.group("link_text"))
            if _SAFE_URL.match(url):
                out.append(f'<a href="{html.escape(url, quote=True)}">{label}</a>')
            else:  # another scheme (javascript:, a relative path): the text alone
                out.append(f"{label} ({escape(url)})")
        elif kind in _TAGS:
            tag = _TAGS[kind]
            out.append(f"<{tag}>{_inline(m.group(kind + '_body'))}</{tag}>")
    out.append(escape(text[at:]))
    return "".join(out)


def _prose(text: str) -> str:
    lines = []
    for line in text.split("\n"):
        heading = _HEADING.match(line)
        bullet = _BULLET.match(line)
        if heading:
            lines.append(f"<b>{_inline(heading.group(1))}</b>")
        elif bullet and not re.fullmatch(r"[ \t]*([-*_])([ \t]*\1){2,}[ \t]*", line):
            lines.append(f"{bullet.group(1)}\u2022 {_inline(bullet.group(2))}")
        else:
            lines.append(_inline(line))
    return "\n".join(lines)


def to_html(markdown: str) -> str:
    """``markdown`` as Telegram HTML, always well-formed (see the module docstring)."""
    out: list[str] = []
    at = 0
    for m in _FENCE.finditer(markdown):
        out.append(_prose(markdown[at : m.start()]))
        at = m.end()
        lang, body = m.group(1), m.group(2).rstrip("\n")
        code = escape(body) or " "
        if lang:
            out.append(f'<pre><code class="language-{escape(lang)}">{code}</code></pre>')
        else:
            out.append(f"<pre>{code}</pre>")
    out.append(_prose(markdown[at:]))
    return "".join(out)
