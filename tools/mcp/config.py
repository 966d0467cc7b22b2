"""The ``[mcp.servers.NAME]`` tables: which MCP servers to connect and how.

A stdio server has ``command = ["program", "arg", ...]`` (and ``env = {...}``); a streamable
HTTP server has ``url`` (and ``headers = {...}``). ``"${ENV_NAME}"`` anywhere in a command
argument, an env value, the url or a header value is taken from the environment when the
settings load, so secrets stay out of the file; the resolved values are never logged
(``repr=False``) and errors name the variable, never its value.

An HTTP server may need OAuth (``auth = "oauth"``, ``tools.mcp.oauth``): ``grant`` says how
tokens are got (``"authorization_code"``, the default: a person logs in once with ``reveille
mcp login NAME``; ``"client_credentials"``: with ``client_id`` and ``client_secret``, no
person), ``scopes`` replaces the scopes the server asks for, and ``client_id`` (with
``client_secret`` for a confidential client) or ``client_metadata_url`` (an https URL-based
client id) stand for dynamic client registration.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

Approvals = Literal["always", "never", "unless_read_only"]
APPROVAL_MODES: tuple[str, ...] = ("always", "never", "unless_read_only")
# ``sampling``: whether the server may ask Reveille's model (``sampling/createMessage``):
# after a person's yes, always, or never (the capability is then not offered).
Sampling = Literal["ask", "allow", "deny"]
SAMPLING_MODES: tuple[str, ...] = ("ask", "allow", "deny")
DEFAULT_TIMEOUT_SECONDS = 60.0
Auth = Literal["none", "oauth"]
Grant = Literal["authorization_code", "client_credentials"]
GRANTS: tuple[str, ...] = ("authorization_code", "client_credentials")

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}")
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_KEYS = {
    "command",
    "env",
    "url",
    "headers",
    "include",
    "exclude",
    "approvals",
    "sampling",
    "timeout_seconds",
    "auth",
    "grant",
    "client_id",
    "client_secret",
    "client_metadata_url",
    "scopes",
}
_OAUTH_KEYS = ("grant", "client_id", "client_secret", "client_metadata_url", "scopes")


class McpConfigError(ValueError):
    """A ``[mcp.servers.NAME]`` table Reveille cannot use; the message says where and why."""


@dataclass(frozen=True)
class McpServerConfig:
    """One MCP server as configured (``${...}`` references already resolved)."""

    name: str
    command: tuple[str, ...] = field(default=(), repr=False)
    env: Mapping[str, str] = field(default_factory=dict, repr=False, hash=False, compare=False)
    url: str = field(default="", repr=False)
    headers: Mapping[str, str] = field(default_factory=dict, repr=False, hash=False, compare=False)
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    approvals: Approvals = "unless_read_only"
    sampling: Sampling = "ask"
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    auth: Auth = "none"
    grant: Grant = "authorization_code"
    client_id: str = ""
    client_secret: str = field(default="", repr=False)
    client_metadata_url: str = ""
    scopes: tuple[str, ...] = ()

    @property
    def transport(self) -> str:
        return "stdio" if self.command else "http"

    @property
    def toolset(self) -> str:
        """The toolset a delegation names to hand this server's tools to a sub-agent."""
        return f"mcp:{self.name}"

    def takes(self, tool: str) -> bool:
        """Whether the server's tool ``tool`` is offered: it matches an ``include`` glob
        (none = all) and no ``exclude`` glob."""
        if self.include and not any(fnmatch.fnmatchcase(tool, g) for g in self.include):
            return False
        return not any(fnmatch.fnmatchcase(tool, g) for g in self.exclude)

    def asks(self, read_only: bool) -> bool:
        """Whether a call of a tool (``read_only``: its readOnlyHint) needs a person's yes."""
        if self.approvals == "never":
            return False
        return self.approvals == "always" or not read_only


def parse_servers(
    table: object, *, origin: str, environ: Mapping[str, str]
) -> tuple[McpServerConfig, ...]:
    """The servers of the ``[mcp]`` table (``{"servers": {NAME: {...}}}``); ``origin`` says
    where it came from in errors."""
    if not isinstance(table, dict) or set(table) - {"servers"}:
        raise McpConfigError(f"{origin} [mcp]: expected only [mcp.servers.NAME] tables")
    servers = table.get("servers") or {}
    if not isinstance(servers, dict):
        raise McpConfigError(f"{origin} [mcp.servers]: expected [mcp.servers.NAME] tables")
    return tuple(
        _server(name, body, f"{origin} [mcp.servers.{name}]", environ)
        for name, body in servers.items()
    )


def _server(name: str, body: object, where: str, environ: Mapping[str, str]) -> McpServerConfig:
    if not _NAME.fullmatch(name) or "__" in name:
        raise McpConfigError(
            f"{where}: a server name is 1-32 letters, digits, '-' or '_' (no '__'), "
            "starting with a letter or digit"
        )
    if not isinstance(body, dict):
        raise McpConfigError(f"{where}: expected a table")
    unknown = sorted(set(body) - _KEYS)
    if unknown:
        raise McpConfigError(f"{where}: unknown key(s) {', '.join(unknown)}")
    command = _strings(body.get("command", []), where, "command")
    url = body.get("url", "")
    if not isinstance(url, str):
        raise McpConfigError(f"{where}: url must be a string")
    if bool(command) == bool(url):
        raise McpConfigError(f"{where}: set either command = [...] (stdio) or url (HTTP)")
    if url and not re.match(r"https?://", url):
        raise McpConfigError(f"{where}: url must be an http(s):// address")
    if command and "headers" in body:
        raise McpConfigError(f"{where}: headers are for url servers; use env with command")
    if url and "env" in body:
        raise McpConfigError(f"{where}: env is for command servers; use headers with url")
    approvals = body.get("approvals", "unless_read_only")
    if approvals not in APPROVAL_MODES:
        raise McpConfigError(f"{where}: approvals must be one of {', '.join(APPROVAL_MODES)}")
    sampling = body.get("sampling", "ask")
    if sampling not in SAMPLING_MODES:
        raise McpConfigError(f"{where}: sampling must be one of {', '.join(SAMPLING_MODES)}")
    timeout = body.get("timeout_seconds", DEFAULT_TIMEOUT_SECONDS)
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        raise McpConfigError(f"{where}: timeout_seconds must be a positive number")
    auth = body.get("auth", "none")
    if auth not in ("none", "oauth"):
        raise McpConfigError(f"{where}: auth must be none or oauth")
    if auth == "oauth" and not url:
        raise McpConfigError(f'{where}: auth = "oauth" is for url servers')
    if auth != "oauth" and any(key in body for key in _OAUTH_KEYS):
        raise McpConfigError(f'{where}: {", ".join(_OAUTH_KEYS)} need auth = "oauth"')
    grant = body.get("grant", "authorization_code")
    if grant not in GRANTS:
        raise McpConfigError(f"{where}: grant must be one of {', '.join(GRANTS)}")
    client_id = _text(body, "client_id", where, environ)
    client_secret = _text(body, "client_secret", where, environ)
    metadata_url = _text(body, "client_metadata_url", where, environ)
    if grant == "client_credentials" and not (client_id and client_secret):
        raise McpConfigError(
            f'{where}: grant = "client_credentials" needs client_id and client_secret'
        )
    if client_secret and not client_id:
        raise McpConfigError(f"{where}: client_secret needs client_id")
    if metadata_url and not re.match(r"https://[^/]+/.", metadata_url):
        raise McpConfigError(f"{where}: client_metadata_url must be an https:// URL with a path")
    return McpServerConfig(
        name=name,
        command=tuple(_resolve(arg, where, "command", environ) for arg in command),
        env=_mapping(body.get("env", {}), where, "env", environ),
        url=_resolve(url, where, "url", environ),
        headers=_mapping(body.get("headers", {}), where, "headers", environ),
        include=_strings(body.get("include", []), where, "include"),
        exclude=_strings(body.get("exclude", []), where, "exclude"),
        approvals=approvals,
        sampling=sampling,
        timeout_seconds=float(timeout),
        auth=auth,
        grant=grant,
        client_id=client_id,
        client_secret=client_secret,
        client_metadata_url=metadata_url,
        scopes=_strings(body.get("scopes", []), where, "scopes"),
    )


def _text(body: Mapping[str, object], key: str, where: str, environ: Mapping[str, str]) -> str:
    value = body.get(key, "")
    if not isinstance(value, str):
        raise McpConfigError(f"{where}: {key} must be a string")
    return _resolve(value, where, key, environ)


def _strings(value: object, where: str, key: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise McpConfigError(f"{where}: {key} must be a list of strings")
    return tuple(value)


def _mapping(value: object, where: str, key: str, environ: Mapping[str, str]) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise McpConfigError(f"{where}: {key} must be a table of strings")
    return {str(k): _resolve(v, where, f"{key}.{k}", environ) for k, v in value.items()}


def _resolve(text: str, where: str, key: str, environ: Mapping[str, str]) -> str:
    """``text`` with each ``${NAME}`` replaced by the environment's value."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in environ:
            raise McpConfigError(f"{where}: {key} names ${{{name}}}, which is not set")
        return environ[name]

    return _ENV_REF.sub(value, text)
