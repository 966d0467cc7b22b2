"""JSON written to the wire, fast: what a model provider is sent, and what the API server
answers and streams. ``orjson`` writes the same text the standard library writes with
``ensure_ascii=False, separators=(",", ":")`` (UTF-8, no spaces), about twenty times
faster; a request's history is written again on every model call, and a streamed answer
is one JSON object per piece.

Where ``orjson`` would answer differently, the standard library writes it, as before: an
integer beyond 64 bits, a key that is not a string, a type only the standard library knows.
Two differences remain, both for values that are not JSON at all: a float's exponent is
written ``1e-5`` where the standard library writes ``1e-05`` (the same number), and a NaN
or an infinity becomes ``null`` where the standard library writes ``NaN`` (which no JSON
parser reads back). A lone surrogate raises ``UnicodeEncodeError`` either way.

Reading stays with the standard library: ``orjson`` reads an integer beyond 64 bits as a
float, silently, where Reveille must keep the number or refuse it.
"""

from __future__ import annotations

import json

import orjson

__all__ = ["dumps"]


def dumps(value: object) -> bytes:
    """``value`` as compact UTF-8 JSON (see the module docstring)."""
    try:
        return orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError is one
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
