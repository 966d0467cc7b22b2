"""Settings: defaults, then an optional TOML file, then environment variables; validated.

The state directory is ``~/.reveille`` unless ``REVEILLE_HOME`` names another. The file is
``$REVEILLE_HOME/config.toml`` unless ``REVEILLE_CONFIG`` names another. Every bad value is
reported with where it came from and what is allowed.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from delivery.policy import DeliveryPolicy


class SettingsError(ValueError):
    """A setting has a value Reveille cannot use; the message says which and why."""


def state_dir(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(env.get("REVEILLE_HOME") or Path.home() / ".reveille").expanduser()


@dataclass(frozen=True)
class Settings:
    home: Path = field(default_factory=state_dir)
    host: str = "127.0.0.1"
    port: int = 8642
    api_key: str = ""
    # Browser origins allowed to call the API (comma-separated, e.g. "https://app.example");
    # requests from any other Origin are refused, so a web page cannot drive the agent.
    cors_origins: str = ""
    # model provider: "demo" (built in, offline) or "openai" (any OpenAI-compatible endpoint)
    provider: str = "demo"
    model: str = "reveille-demo"
    openai_base_url: str = ""
    openai_api_key: str = ""
    demo_delay_seconds: float = 1.0
    shell_enabled: bool = False
    shell_workdir: str = ""
    max_concurrent_runs: int = 10
    context_chars: int = 400_000
    drain_seconds: float = 30.0
    # processes serving the same ports (SO_REUSEPORT) over one store; "auto" = os.cpu_count()
    workers: int = 1
    max_body_bytes: int = 1024 * 1024
    max_async_children: int = 3
    max_queued_delegations: int = 32
    lease_seconds: float = 300.0
    max_attempts: int = 8
    replay_cap_seconds: float = 48 * 3600.0
    # Telegram (gateway/platforms/telegram.py): started when a bot token is set.
    telegram_bot_token: str = ""
    telegram_base_url: str = "https://api.telegram.org"
    telegram_allowed_users: str = ""  # comma-separated user ids; none = nobody
    telegram_webhook_url: str = ""  # webhook mode instead of long polling
    telegram_secret_token: str = ""  # required in webhook mode
    telegram_edit_interval: float = 1.5  # seconds between edits of a streamed reply

    @property
    def telegram_allowed_user_ids(self) -> frozenset[str]:
        return frozenset(u.strip() for u in self.telegram_allowed_users.split(",") if u.strip())

    # the web UI: its own port in the same process (0 = off); a password for beyond loopback
    webui_port: int = 8787
    webui_password: str = ""
    # "" = SQLite under home; postgresql://... = ledger, sessions, idempotency in PostgreSQL
    database_url: str = ""
    # a server whose heartbeat is older than this is dead (its work is recovered)
    peer_timeout_seconds: float = 15.0
    # OTLP/HTTP collector root for traces (reveille.tracing); "" = no traces
    otel_endpoint: str = ""

    @property
    def allowed_origins(self) -> frozenset[str]:
        return frozenset(normalize_origin(o) for o in self.cors_origins.split(",") if o.strip())

    @property
    def ledger_path(self) -> Path:
        return self.home / "ledger.db"

    @property
    def sessions_path(self) -> Path:
        return self.home / "sessions.db"

    @property
    def delivery_policy(self) -> DeliveryPolicy:
        return DeliveryPolicy(
            lease_seconds=self.lease_seconds,
            max_attempts=self.max_attempts,
            replay_cap_seconds=self.replay_cap_seconds,
            peer_timeout_seconds=self.peer_timeout_seconds,
        )


# setting name -> environment variable
ENV_NAMES: dict[str, str] = {
    "host": "REVEILLE_HOST",
    "port": "REVEILLE_PORT",
    "api_key": "API_SERVER_KEY",
    "cors_origins": "REVEILLE_CORS_ORIGINS",
    "provider": "REVEILLE_PROVIDER",
    "model": "REVEILLE_MODEL",
    "openai_base_url": "OPENAI_BASE_URL",
    "openai_api_key": "OPENAI_API_KEY",
    "demo_delay_seconds": "REVEILLE_DEMO_DELAY_SECONDS",
    "shell_enabled": "REVEILLE_SHELL_ENABLED",
    "shell_workdir": "REVEILLE_SHELL_WORKDIR",
    "max_concurrent_runs": "REVEILLE_MAX_CONCURRENT_RUNS",
    "context_chars": "REVEILLE_CONTEXT_CHARS",
    "drain_seconds": "REVEILLE_DRAIN_SECONDS",
    "workers": "REVEILLE_WORKERS",
    "max_body_bytes": "REVEILLE_MAX_BODY_BYTES",
    "max_async_children": "REVEILLE_MAX_ASYNC_CHILDREN",
    "max_queued_delegations": "REVEILLE_MAX_QUEUED_DELEGATIONS",
    "lease_seconds": "REVEILLE_LEASE_SECONDS",
    "max_attempts": "REVEILLE_MAX_ATTEMPTS",
    "replay_cap_seconds": "REVEILLE_REPLAY_CAP_SECONDS",
    "telegram_bot_token": "TELEGRAM_BOT_TOKEN",
    "telegram_base_url": "TELEGRAM_BASE_URL",
    "telegram_allowed_users": "TELEGRAM_ALLOWED_USERS",
    "telegram_webhook_url": "TELEGRAM_WEBHOOK_URL",
    "telegram_secret_token": "TELEGRAM_SECRET_TOKEN",
    "telegram_edit_interval": "TELEGRAM_EDIT_INTERVAL",
    "webui_port": "REVEILLE_WEBUI_PORT",
    "webui_password": "REVEILLE_WEBUI_PASSWORD",
    "database_url": "REVEILLE_DATABASE_URL",
    "peer_timeout_seconds": "REVEILLE_PEER_TIMEOUT_SECONDS",
    "otel_endpoint": "OTEL_EXPORTER_OTLP_ENDPOINT",
}

# TOML sections map onto flat names: [server] host -> host, [shell] enabled -> shell_enabled ...
_TOML_ALIASES = {
    ("server", "host"): "host",
    ("server", "port"): "port",
    ("server", "api_key"): "api_key",
    ("server", "cors_origins"): "cors_origins",
    ("server", "max_concurrent_runs"): "max_concurrent_runs",
    ("server", "workers"): "workers",
    ("server", "drain_seconds"): "drain_seconds",
    ("server", "max_body_bytes"): "max_body_bytes",
    ("model", "provider"): "provider",
    ("model", "name"): "model",
    ("model", "base_url"): "openai_base_url",
    ("model", "api_key"): "openai_api_key",
    ("model", "demo_delay_seconds"): "demo_delay_seconds",
    ("model", "context_chars"): "context_chars",
    ("shell", "enabled"): "shell_enabled",
    ("shell", "workdir"): "shell_workdir",
    ("delegation", "max_async_children"): "max_async_children",
    ("delegation", "max_queued"): "max_queued_delegations",
    ("delivery", "lease_seconds"): "lease_seconds",
    ("delivery", "max_attempts"): "max_attempts",
    ("delivery", "replay_cap_seconds"): "replay_cap_seconds",
    ("telegram", "bot_token"): "telegram_bot_token",
    ("telegram", "base_url"): "telegram_base_url",
    ("telegram", "allowed_users"): "telegram_allowed_users",
    ("telegram", "webhook_url"): "telegram_webhook_url",
    ("telegram", "secret_token"): "telegram_secret_token",
    ("telegram", "edit_interval"): "telegram_edit_interval",
    ("webui", "port"): "webui_port",
    ("webui", "password"): "webui_password",
    ("storage", "url"): "database_url",
    ("storage", "peer_timeout_seconds"): "peer_timeout_seconds",
    ("otel", "endpoint"): "otel_endpoint",
}

_ORIGIN_RE = re.compile(r"https?://[a-z0-9.\-\[\]:]+")


def normalize_origin(origin: str) -> str:
    """An origin as browsers send it: lower-case scheme and host, no trailing slash."""
    return origin.strip().rstrip("/").lower()


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _coerce(name: str, kind: type, value: Any, origin: str) -> Any:
    try:
        if name == "workers":
            return _workers(value)
        if kind is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in _TRUE:
                return True
            if text in _FALSE:
                return False
            raise ValueError("expected true or false")
        if kind is int:
            if isinstance(value, bool):
                raise ValueError("expected a whole number")
            return int(value)
        if kind is float:
            return float(value)
        if isinstance(value, list):  # a TOML array, e.g. cors_origins or allowed_users
            if not all(isinstance(v, str | int) and not isinstance(v, bool) for v in value):
                raise ValueError("expected strings")
            return ",".join(str(v) for v in value)
        return str(value)
    except (TypeError, ValueError) as exc:
        raise SettingsError(f"{origin}: {name} = {value!r} is not valid ({exc})") from None


def _workers(value: Any) -> int:
    """A worker count: a whole number of at least 1, or ``auto`` (one per core)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return os.cpu_count() or 1
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError("expected a whole number of at least 1, or auto")
    try:
        count = int(value)
    except ValueError:
        raise ValueError("expected a whole number of at least 1, or auto") from None
    if count < 1:
        raise ValueError("must be at least 1, or auto")
    return count


def _validate(s: Settings) -> None:
    def bad(name: str, why: str) -> SettingsError:
        return SettingsError(f"{name} = {getattr(s, name)!r}: {why}")

    for name in ("port", "webui_port"):
        if not 0 <= getattr(s, name) <= 65535:
            raise bad(name, "must be 0-65535")
    if s.provider not in {"demo", "openai"}:
        raise bad("provider", 'must be "demo" or "openai"')
    if s.provider == "openai" and not s.openai_base_url and not s.openai_api_key:
        raise bad("provider", "openai needs OPENAI_API_KEY (and OPENAI_BASE_URL for non-OpenAI)")
    for name in (
        "max_concurrent_runs",
        "workers",
        "max_body_bytes",
        "max_async_children",
        "max_attempts",
    ):
        if getattr(s, name) < 1:
            raise bad(name, "must be at least 1")
    if s.drain_seconds < 0:
        raise bad("drain_seconds", "must not be negative")
    if s.context_chars < 1000:
        raise bad("context_chars", "must be at least 1000")
    if s.max_queued_delegations < 0:
        raise bad("max_queued_delegations", "must not be negative")
    if s.database_url and not s.database_url.startswith(("postgresql://", "postgres://")):
        raise bad("database_url", "expected postgresql://user:password@host/dbname (or unset)")
    for name in ("lease_seconds", "replay_cap_seconds", "peer_timeout_seconds"):
        if getattr(s, name) <= 0:
            raise bad(name, "must be positive")
    if s.demo_delay_seconds < 0:
        raise bad("demo_delay_seconds", "must not be negative")
    if s.telegram_webhook_url and not s.telegram_secret_token:
        raise bad("telegram_webhook_url", "webhook mode needs [telegram] secret_token")
    if s.workers > 1 and s.telegram_bot_token and not s.telegram_webhook_url:
        raise bad(
            "workers",
            "Telegram long polling allows one poller per bot token; with several workers "
            "use webhook mode ([telegram] webhook_url) or REVEILLE_WORKERS=1",
        )
    if s.telegram_edit_interval < 0:
        raise bad("telegram_edit_interval", "must not be negative")
    if s.otel_endpoint and not s.otel_endpoint.startswith(("http://", "https://")):
        raise bad("otel_endpoint", "expected the collector's http(s):// root (or unset)")
    for origin in s.cors_origins.split(","):
        if origin.strip() and not _ORIGIN_RE.fullmatch(normalize_origin(origin)):
            raise bad("cors_origins", f"{origin.strip()!r} is not an origin like https://host:port")


def load_settings(
    environ: Mapping[str, str] | None = None,
    config_file: str | Path | None = None,
    **overrides: Any,
) -> Settings:
    env = os.environ if environ is None else environ
    home = state_dir(env)
    types = {f.name: f.type for f in fields(Settings)}
    kinds = {"bool": bool, "int": int, "float": float, "str": str}
    values: dict[str, Any] = {}

    path = Path(config_file or env.get("REVEILLE_CONFIG") or home / "config.toml").expanduser()
    explicit = bool(config_file or env.get("REVEILLE_CONFIG"))
    if path.exists():
        try:
            data = tomllib.loads(path.read_text())
        except (tomllib.TOMLDecodeError, OSError, UnicodeDecodeError) as exc:
            raise SettingsError(f"{path}: not valid TOML: {exc}") from None
        for section, table in data.items():
            items = table.items() if isinstance(table, dict) else [(None, table)]
            for key, value in items:
                name = _TOML_ALIASES.get((section, key)) if key else section
                if name is None or name not in types or name == "home":
                    where = f"[{section}] {key}" if key else section
                    raise SettingsError(f"{path}: unknown setting {where}")
                values[name] = _coerce(name, kinds[str(types[name])], value, str(path))
    elif explicit:
        raise SettingsError(f"settings file {path} does not exist")

    for name, var in ENV_NAMES.items():
        if var in env:
            values[name] = _coerce(name, kinds[str(types[name])], env[var], f"${var}")
    for name, value in overrides.items():
        if value is not None:
            values[name] = _coerce(name, kinds[str(types[name])], value, "command line")
    settings = Settings(home=home, **values)
    _validate(settings)
    return settings
