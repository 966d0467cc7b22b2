"""What a watch is and when it may fire: its spec, its bounds, the pattern guard, the line
scanner and the cooldown rule. No threads and no store here (``tools.watches`` runs them).

A watch says "now" when a background process's output has a line matching a pattern, or
when a command run at an interval exits 0. It fires at most ``max_fires`` times, at least
``cooldown_seconds`` apart, and ends (visibly) when its lifetime runs out.

The pattern guard: Python's ``re`` cannot be interrupted, so a pattern that backtracks
catastrophically would stall the server. Patterns are therefore refused when they can:
a repeat inside a repeat (``(a+)+``), an alternation inside a repeat (``(a|aa)*``), a
backreference, or more than ``MAX_WIDE_REPEATS`` repeats that match more than a few
characters (``.*.*.*`` is cubic). What is left is at most quadratic in the line, and every
line is cut to ``MAX_LINE_CHARS`` before it is matched.
"""

from __future__ import annotations

import math
import re
import re._constants as sre_c  # type: ignore[import-not-found]  # the parser has no stubs
import re._parser as sre_p  # type: ignore[import-not-found]
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, TypedDict

from agent.messages import JSONObject
from agent.tool_args import required_note

__all__ = [
    "MAX_LINE_CHARS",
    "LineScanner",
    "WatchError",
    "WatchOrigin",
    "WatchSpec",
    "WatchState",
    "compile_guarded",
    "fire_id",
    "parse_watch",
]

MAX_LINE_CHARS = 512
"""Each output line is matched on its first this many characters: the worst pattern the
guard lets through (``.*.*x`` on 512 characters that never match) takes about 0.1 s."""
MAX_PATTERN_CHARS = 300
MAX_WIDE_REPEATS = 2
_WIDE = 16  # a repeat that may match more than this many times counts as wide
MIN_INTERVAL_SECONDS = 5.0
MAX_INTERVAL_SECONDS = 86400.0
DEFAULT_COMMAND_TIMEOUT_SECONDS = 30.0
MAX_COMMAND_TIMEOUT_SECONDS = 300.0
DEFAULT_LIFETIME_SECONDS = 3600.0
MAX_LIFETIME_SECONDS = 7 * 86400.0
MIN_LIFETIME_SECONDS = 1.0
DEFAULT_COOLDOWN_SECONDS = 60.0
MAX_FIRES = 100
MAX_NOTE_CHARS = 4000
MAX_COMMAND_CHARS = 4000
OUTPUT = "output"
COMMAND = "command"


class WatchError(ValueError):
    """Arguments a watch cannot be set with; the message says what to give instead."""


_REPEATS = (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT, sre_c.POSSESSIVE_REPEAT)


def _children(op: Any, av: Any) -> list[Any]:
    if op in _REPEATS:
        return [av[2]]
    if op is sre_c.SUBPATTERN:
        return [av[3]]
    if op in (sre_c.ASSERT, sre_c.ASSERT_NOT):
        return [av[1]]
    if op is sre_c.BRANCH:
        return list(av[1])
    if op is sre_c.ATOMIC_GROUP:
        return [av]
    return []


def _walk(sub: Any, in_repeat: bool) -> int:
    """The wide repeats under ``sub``; WatchError for a construct that can backtrack badly."""
    wide = 0
    for op, av in sub:
        if op in (sre_c.GROUPREF, sre_c.GROUPREF_EXISTS, sre_c.GROUPREF_IGNORE):
            raise WatchError("pattern: backreferences are not allowed in a watch")
        if in_repeat and (op is sre_c.BRANCH or (op in _REPEATS and av[1] > 1)):
            raise WatchError(
                "pattern: a repeat or an alternation inside a repeated group can take "
                "exponential time; write it without nesting (e.g. 'a+' for '(a+)+')"
            )
        repeated = op in _REPEATS and av[1] > 1
        if op in _REPEATS and av[1] > _WIDE:
            wide += 1
        for child in _children(op, av):
            wide += _walk(child, in_repeat or repeated)
    return wide


def compile_guarded(pattern: object) -> re.Pattern[str]:
    """``pattern`` compiled, or WatchError when it is not a string, too long, invalid or
    able to backtrack catastrophically (see the module's docstring)."""
    if not isinstance(pattern, str) or not pattern:
        raise WatchError("pattern must be a non-empty regular expression")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise WatchError(f"pattern is {len(pattern)} characters; at most {MAX_PATTERN_CHARS}")
    try:
        parsed = sre_p.parse(pattern)
        compiled = re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        raise WatchError(f"pattern is not a valid regular expression: {exc}") from None
    if _walk(parsed, False) > MAX_WIDE_REPEATS:
        raise WatchError(
            f"pattern: at most {MAX_WIDE_REPEATS} open-ended repeats (*, +, {{n,}}); more "
            "can take too long on a long line"
        )
    return compiled


class LineScanner:
    """Bytes in, whole lines out, each cut to ``limit`` characters; a huge line costs at
    most a few times ``limit`` bytes of memory however long it runs."""

    def __init__(self, limit: int = MAX_LINE_CHARS) -> None:
        self._limit = limit
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[str]:
        lines: list[str] = []
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            self._take(data, start, end)
            lines.append(self._flush())
            start = end + 1
        self._take(data, start, len(data))
        return lines

    def finish(self) -> list[str]:
        """The last line, when the output did not end with a newline."""
        return [self._flush()] if self._buf else []

    def _take(self, data: bytes, start: int, end: int) -> None:
        room = 4 * self._limit - len(self._buf)  # UTF-8: at most 4 bytes a character
        if room > 0:
            self._buf += data[start : min(end, start + room)]

    def _flush(self) -> str:
        text = self._buf.decode("utf-8", errors="replace")[: self._limit]
        self._buf.clear()
        return text.rstrip("\r")


@dataclass(frozen=True, slots=True)
class WatchOrigin:
    """The conversation a watch wakes."""

    session_key: str | None = None
    origin_session_id: str | None = None
    origin_ui_session_id: str | None = None


@dataclass(frozen=True, slots=True)
class WatchSpec:
    """A valid watch, as its ledger row's ``request`` stores it (``as_request``)."""

    note: str
    kind: str  # OUTPUT or COMMAND
    created_at: float
    expires_at: float
    cooldown_seconds: float
    max_fires: int
    process_id: str | None = None
    pattern: str | None = None
    command: str | None = None
    interval_seconds: float | None = None
    timeout_seconds: float | None = None

    def as_request(self) -> JSONObject:
        return {"watch": asdict(self)}

    @classmethod
    def from_request(cls, request: Mapping[str, object] | None) -> WatchSpec:
        stored = (request or {}).get("watch")
        if not isinstance(stored, dict):
            raise WatchError("the row holds no watch")
        return cls(**{k: stored[k] for k in cls.__slots__ if k in stored})

    def describe(self) -> str:
        if self.kind == OUTPUT:
            return f"output of {self.process_id} matches /{self.pattern}/"
        return f"`{self.command}` exits 0 (every {self.interval_seconds:g} s)"


@dataclass(slots=True)
class WatchState:
    """How often a watch has fired, and when last (read back from its firing rows)."""

    fires: int = 0
    last_fired_at: float | None = None

    def may_fire(self, spec: WatchSpec, now: float) -> bool:
        if self.fires >= spec.max_fires:
            return False
        last = self.last_fired_at
        return last is None or now - last >= spec.cooldown_seconds

    def done(self, spec: WatchSpec) -> bool:
        return self.fires >= spec.max_fires


class _CommonSpec(TypedDict):
    """The ``WatchSpec`` fields both kinds of watch share, as ``parse_watch`` reads them."""

    note: str
    created_at: float
    expires_at: float
    cooldown_seconds: float
    max_fires: int


def fire_id(watch_id: str, number: int) -> str:
    """The ledger id of a watch's ``number``-th firing: one row per firing, whoever and
    however often (a crash, a restart) tries to write it."""
    return f"{watch_id}.{number}"


def _seconds(
    args: Mapping[str, object], key: str, default: float, low: float, high: float
) -> float:
    value = args.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise WatchError(f"{key} must be a number of seconds")
    try:
        seconds = float(value)
    except ValueError:
        raise WatchError(f"{key} must be a number of seconds") from None
    if not math.isfinite(seconds) or not low <= seconds <= high:
        raise WatchError(f"{key} must be between {low:g} and {high:g} seconds")
    return seconds


def parse_watch(
    args: Mapping[str, object], now: float, *, min_interval_seconds: float = MIN_INTERVAL_SECONDS
) -> WatchSpec:
    """The watch ``args`` ask for, or WatchError saying what is wrong."""
    note = required_note(
        args.get("note"),
        purpose="what to do when it fires",
        max_chars=MAX_NOTE_CHARS,
        error=WatchError,
    )
    has_output, has_command = args.get("pattern") is not None, args.get("command") is not None
    if has_output == has_command:
        raise WatchError(
            "give either pattern with process_id (watch a background process's output) or "
            "command with interval_seconds (run it until it exits 0)"
        )
    lifetime = _seconds(
        args,
        "lifetime_seconds",
        DEFAULT_LIFETIME_SECONDS,
        MIN_LIFETIME_SECONDS,
        MAX_LIFETIME_SECONDS,
    )
    cooldown = _seconds(args, "cooldown_seconds", DEFAULT_COOLDOWN_SECONDS, 0, MAX_LIFETIME_SECONDS)
    fires = args.get("max_fires", 1)
    if isinstance(fires, bool) or not isinstance(fires, int) or not 1 <= fires <= MAX_FIRES:
        raise WatchError(f"max_fires must be a whole number from 1 to {MAX_FIRES}")
    common: _CommonSpec = {
        "note": note,
        "created_at": now,
        "expires_at": now + lifetime,
        "cooldown_seconds": cooldown,
        "max_fires": fires,
    }
    if has_output:
        process_id = args.get("process_id")
        if not isinstance(process_id, str) or not process_id.startswith("proc_"):
            raise WatchError("process_id must be the id the terminal tool gave (proc_...)")
        pattern = compile_guarded(args["pattern"]).pattern
        return WatchSpec(kind=OUTPUT, process_id=process_id, pattern=pattern, **common)
    command = args["command"]
    if not isinstance(command, str) or not command.strip():
        raise WatchError("command must be a non-empty shell command")
    if len(command) > MAX_COMMAND_CHARS:
        raise WatchError(f"command is {len(command)} characters; at most {MAX_COMMAND_CHARS}")
    interval = _seconds(
        args,
        "interval_seconds",
        max(60.0, min_interval_seconds),
        min_interval_seconds,
        MAX_INTERVAL_SECONDS,
    )
    timeout = _seconds(
        args,
        "timeout_seconds",
        min(DEFAULT_COMMAND_TIMEOUT_SECONDS, interval),
        1.0,
        MAX_COMMAND_TIMEOUT_SECONDS,
    )
    return WatchSpec(
        kind=COMMAND, command=command, interval_seconds=interval, timeout_seconds=timeout, **common
    )
