"""Telegram message text: escaping for ``parse_mode=HTML`` and splitting at the length limit.

Model output is sent as literal text: every ``<``, ``>`` and ``&`` is escaped, so nothing a
model writes can be read as markup and make Telegram refuse the message ("can't parse
entities"). Telegram allows 4,096 characters per message (counted after entity parsing, in
UTF-16 code units); a longer reply is split into several messages, at paragraph boundaries
where it can be, then at line ends, then at spaces, and only as a last resort inside a word.
A piece is measured escaped, so escaping never pushes a piece over the limit.
"""

from __future__ import annotations

import html

__all__ = ["MAX_MESSAGE_LENGTH", "escape", "split_message", "utf16_len"]

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
