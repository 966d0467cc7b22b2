"""The ``[hooks]`` table of the settings file: the inbound-event hooks (``POST
/v1/hooks/{name}``) and their knobs.

``[hooks.NAME]`` declares a hook; ``session = "..."`` routes its events to that conversation
(a session id of the session store: an API session's id, a chat's session). A hook without
a session still stores its events for ``wake_when`` waits. The scalar keys of ``[hooks]`` are
ordinary settings (``max_body_bytes``, ``rotation_overlap_seconds``, ``lookback_seconds``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from delivery.inbound import HookRoute

__all__ = ["HOOK_NAME", "parse_hook_tables"]

HOOK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_MAX_SESSION = 200


class HookSettingsError(ValueError):
    """A ``[hooks.NAME]`` table Reveille cannot use (the message says where and why)."""


def parse_hook_tables(
    table: Mapping[str, Any], where: str
) -> tuple[dict[str, object], tuple[HookRoute, ...]]:
    """Split ``[hooks]`` into its scalar settings (key -> value, for the usual aliases) and
    the hooks its sub-tables declare, sorted by name."""
    scalars: dict[str, object] = {}
    routes: list[HookRoute] = []
    for key, value in table.items():
        if not isinstance(value, Mapping):
            scalars[key] = value
            continue
        if not HOOK_NAME.fullmatch(key):
            raise HookSettingsError(
                f"{where} [hooks.{key}]: a hook name is 1-64 letters, digits, '_', '-' or '.'"
            )
        unknown = set(value) - {"session"}
        if unknown:
            raise HookSettingsError(
                f"{where} [hooks.{key}]: unknown setting {sorted(unknown)[0]} (known: session)"
            )
        session = value.get("session")
        if session is not None and (
            not isinstance(session, str) or not session.strip() or len(session) > _MAX_SESSION
        ):
            raise HookSettingsError(
                f"{where} [hooks.{key}] session: a session id (1-{_MAX_SESSION} characters)"
            )
        routes.append(HookRoute(key, session.strip() if isinstance(session, str) else None))
    return scalars, tuple(sorted(routes, key=lambda r: r.name))
