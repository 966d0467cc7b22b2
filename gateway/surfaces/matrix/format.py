"""Matrix message text: the model's markdown as ``org.matrix.custom.html`` beside a plain
``body``, and splitting.

``to_html`` is safe by construction: every ``<``, ``>``, ``&`` and ``"`` of the model's text is
escaped, and the only tags in the result are the ones made here, each emitted with its
closing tag: ``<pre><code>`` for fenced code (an unclosed fence runs to the end of the
piece), ``<code>`` for inline code, ``<strong>``/``<em>``/``<del>`` for matched pairs, and
``<a href>`` for http(s) and mailto links only (any other scheme, ``javascript:`` included,
stays visible text). Line breaks outside code become ``<br>``. Markdown that does not pair
up stays literal text. The plain ``body`` is the markdown itself, for clients that render no
HTML (and for notifications).

Matrix limits an event to 65,536 bytes of JSON, which holds the body and the HTML (escaping
makes ``&`` five bytes); ``MAX_MESSAGE_LENGTH`` characters of body keep both within it for
any text. A longer reply is split into several messages at paragraph boundaries where it
can be, then at line ends, then at spaces, and only as a last resort inside a word.
"""

from __future__ import annotations

import html
import re

__all__ = ["MAX_MESSAGE_LENGTH", "split_message", "to_html"]

MAX_MESSAGE_LENGTH = 6000

_BOUNDARIES = ("\n\n", "\n", " ")
_FENCE = re.compile(r"```([A-Za-z0-9_+#.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)
_INLINE = re.compile(
    r"`(?P<code>[^`\n]+)`"
    r"|\[(?P<label>[^\]\n]+)\]\((?P<url>[^)\s]+)\)"
    r"|\*\*(?P<strong>[^*\n]+)\*\*"
    r"|~~(?P<del>[^~\n]+)~~"
    r"|(?<![\w*])\*(?P<em>[^*\n]+)\*(?![\w*])"
)
_SAFE_URL = re.compile(r"^(https?://|mailto:)[^\s\"<>]+$", re.I)


def _escape(text: str) -> str:
    return html.escape(text, quote=True)


def _inline(line: str) -> str:
    """One line: matched pairs become tags, everything else is escaped text."""
    out: list[str] = []
    at = 0
    for m in _INLINE.finditer(line):
        out.append(_escape(line[at : m.start()]))
        at = m.end()
        if m.group("code") is not None:
            out.append(f"<code>{_escape(m.group('code'))}</code>")
        elif m.group("url") is not None:
            url, label = m.group("url"), _inline(m.group("label"))
            if _SAFE_URL.match(url):
                out.append(f'<a href="{_escape(url)}">{label}</a>')
            else:
                out.append(f"{label} ({_escape(url)})")
        else:
            tag = next(t for t in ("strong", "del", "em") if m.group(t) is not None)
            out.append(f"<{tag}>{_inline(m.group(tag))}</{tag}>")
    out.append(_escape(line[at:]))
    return "".join(out)


def _prose(text: str) -> str:
    return "<br>".join(_inline(line) for line in text.split("\n"))


def to_html(markdown: str) -> str:
    """``markdown`` as Matrix HTML, always well-formed (see the module docstring)."""
    out: list[str] = []
    at = 0
    for m in _FENCE.finditer(markdown):
        out.append(_prose(markdown[at : m.start()]))
        at = m.end()
        lang, body = m.group(1), _escape(m.group(2).rstrip("\n"))
        cls = f' class="language-{_escape(lang)}"' if lang else ""
        out.append(f"<pre><code{cls}>{body}</code></pre>")
    out.append(_prose(markdown[at:]))
    return "".join(out)


def _cut(text: str, limit: int) -> int:
    """Where to end a piece of ``text`` that is longer than ``limit``."""
    for boundary in _BOUNDARIES:
        at = text.rfind(boundary, 0, limit)
        if at > 0:
            return at
    return limit


def split_message(text: str, limit: int = MAX_MESSAGE_LENGTH) -> list[str]:
    """``text`` in pieces of at most ``limit`` characters, none empty (module docstring)."""
    pieces: list[str] = []
    rest = text
    while len(rest) > limit:
        at = _cut(rest, limit)
        piece = rest[:at].rstrip()
        if piece:
            pieces.append(piece)
        rest = rest[at:].lstrip("\n ")
    if rest.strip() or not pieces:
        pieces.append(rest)
    return pieces
