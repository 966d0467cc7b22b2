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
from urllib.parse import urlsplit

from delivery.inbound import HookRoute
from delivery.policy import DeliveryPolicy
from delivery.retention import RetentionPolicy
from gateway.turns.compaction import CompactionPolicy
from gateway.webhooks import check_secret
from reveille.hook_settings import HookSettingsError, parse_hook_tables
from reveille.setting_names import ENV_NAMES, RETENTION_KEYS, TOML_ALIASES
from tools.mcp.config import McpConfigError, McpServerConfig, parse_servers


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
    # "always": a person approves each shell command (web UI, API, Telegram, CLI);
    # "never": commands run at once (the banner says so)
    shell_approvals: str = "always"
    # how long a background unit's approval waits for a person before it expires
    shell_approval_timeout: float = 3600.0
    # how long a turn parked on a client's tool calls waits for their results, in seconds
    client_tool_timeout: float = 600.0
    # the nearest a wake-up the agent sets (schedule_wakeup) may be, in seconds
    timers_min_delay_seconds: float = 10.0
    max_concurrent_runs: int = 10
    context_chars: int = 400_000
    # compaction (gateway/turns/compaction.py): the model's context window in tokens (0 = unknown:
    # only the provider's "context length exceeded" compacts) and the cap on a summary
    context_window: int = 0
    compaction_summary_chars: int = 8000
    drain_seconds: float = 30.0
    # processes serving the same ports (SO_REUSEPORT) over one store; "auto" = os.cpu_count()
    workers: int = 1
    max_body_bytes: int = 1024 * 1024
    max_async_children: int = 3
    max_queued_delegations: int = 32
    # sub-agents: levels of delegation (1 = sub-agents cannot delegate), model calls each,
    # and seconds without progress (no model answer, one tool still running) before a stop
    delegation_max_depth: int = 1
    delegation_max_steps: int = 20
    delegation_stall_seconds: float = 300.0
    lease_seconds: float = 300.0
    max_attempts: int = 8
    replay_cap_seconds: float = 48 * 3600.0
    # Results of one session arriving within this window of each other (or while its
    # wake-up is pending or running) become ONE wake-up turn (gateway.coalesce).
    coalesce_seconds: float = 2.0
    # Characters of result text one wake-up may carry; longer results are cut, with a
    # pointer to the full one (gateway.wake_text.format_wake_batch).
    wake_text_budget: int = 24_000
    # Telegram (gateway/surfaces/telegram/adapter.py): started when a bot token is set.
    telegram_bot_token: str = ""
    telegram_base_url: str = "https://api.telegram.org"
    telegram_allowed_users: str = ""  # comma-separated user ids; none = nobody
    telegram_webhook_url: str = ""  # webhook mode instead of long polling
    telegram_secret_token: str = ""  # required in webhook mode
    telegram_edit_interval: float = 1.5  # seconds between edits of a streamed reply
    # Discord (gateway/surfaces/discord): started when a bot token is set.
    discord_bot_token: str = ""
    discord_allowed_users: str = ""  # comma-separated user ids (snowflakes); none = nobody
    discord_api_base: str = "https://discord.com/api/v10"  # the REST root (proxy, stand-in)
    # Matrix (gateway/surfaces/matrix): started when a homeserver is set.
    matrix_homeserver: str = ""  # the homeserver's URL (https://matrix.example.org)
    matrix_user_id: str = ""  # the bot's account (@bot:example.org)
    matrix_access_token: str = ""  # or matrix_password: log in once, the device is kept
    matrix_password: str = ""
    matrix_allowed_users: str = ""  # comma-separated user ids (@me:example.org); none = nobody
    # Slack (gateway/surfaces/slack): started when a bot token is set.
    slack_bot_token: str = ""  # xoxb-...
    slack_app_token: str = ""  # xapp-...: Socket Mode
    slack_signing_secret: str = ""  # the Events API and interactivity over HTTP
    slack_base_url: str = "https://slack.com/api/"  # the Web API root (proxy, stand-in)
    slack_allowed_users: str = ""  # comma-separated member ids (U0123ABC); none = nobody

    @property
    def webui_trusted_proxy_set(self) -> frozenset[str]:
        return frozenset(p.strip() for p in self.webui_trusted_proxies.split(",") if p.strip())

    @property
    def telegram_allowed_user_ids(self) -> frozenset[str]:
        return frozenset(u.strip() for u in self.telegram_allowed_users.split(",") if u.strip())

    @property
    def discord_allowed_user_ids(self) -> frozenset[str]:
        return frozenset(u.strip() for u in self.discord_allowed_users.split(",") if u.strip())

    @property
    def matrix_allowed_user_ids(self) -> frozenset[str]:
        return frozenset(u.strip() for u in self.matrix_allowed_users.split(",") if u.strip())

    @property
    def slack_allowed_user_ids(self) -> frozenset[str]:
        return frozenset(u.strip() for u in self.slack_allowed_users.split(",") if u.strip())

    # the web UI: its own port in the same process (0 = off); a password for beyond loopback
    webui_port: int = 8787
    webui_password: str = ""
    # reverse proxies (comma-separated addresses) whose X-Forwarded-For names the client that
    # a login attempt is counted for; none = the peer's address, the header ignored
    webui_trusted_proxies: str = ""
    # "" = SQLite under home; postgresql://... = ledger, sessions, idempotency in PostgreSQL
    database_url: str = ""
    # a server whose heartbeat is older than this is dead (its work is recovered)
    peer_timeout_seconds: float = 15.0
    # Standard Webhooks endpoints (comma-separated or a TOML array) and the whsec_ secret;
    # without a secret here, the one `reveille webhooks secret` stored signs
    webhook_urls: str = ""
    webhook_secret: str = ""
    # webhooks for foreground (non-background) responses too; OpenAI sends background only
    webhook_foreground: bool = False
    # inbound events (POST /v1/hooks/{name}): the hooks ([hooks.NAME], reveille.hook_settings),
    # a body cap, how long a rotated-out secret still verifies, how far back a wake_when wait
    # looks for an event that came before it was set
    hooks: tuple[HookRoute, ...] = ()
    hooks_max_body_bytes: int = 256 * 1024
    hooks_rotation_overlap_seconds: float = 86400.0
    hooks_lookback_seconds: float = 3600.0

    @property
    def webhook_endpoints(self) -> tuple[str, ...]:
        return tuple(u.strip() for u in self.webhook_urls.split(",") if u.strip())

    # [retention]: days each kind is kept once settled (0 = forever), and how often a server
    # prunes (delivery/retention.py says what is never pruned)
    retention_settled_days: float = 30.0
    retention_archived_transcript_days: float = 30.0
    retention_idempotency_days: float = 7.0
    retention_tombstone_days: float = 90.0
    retention_webui_event_days: float = 7.0
    retention_process_output_days: float = 7.0
    retention_hook_event_days: float = 30.0
    retention_interval_seconds: float = 3600.0

    @property
    def shell_asks(self) -> bool:
        """The shell tool is on and a person approves each command."""
        return self.shell_enabled and self.shell_approvals.strip().lower() != "never"

    @property
    def asks_approvals(self) -> bool:
        """Some tool may ask a person: the shell tool, or an MCP server's tools (by its
        ``approvals`` setting) or its questions (elicitation); surfaces then take answers."""
        return self.shell_asks or bool(self.mcp_servers)

    # the Responses API: stored responses are kept this many days after they end (0 =
    # forever); retention's ``stored_responses`` kind reads it (one setting, not two)
    responses_keep_days: float = 30.0
    # a running response's lease; a server silent this long has its responses ended failed
    responses_lease_seconds: float = 30.0
    # background responses running at once on each server, in a pool of their own (they
    # take none of max_concurrent_runs: queued work never refuses chat or wake-ups)
    responses_background_concurrency: int = 4
    # queued background responses, per API key and in all (beyond: 429 with Retry-After)
    responses_max_queued_per_key: int = 100
    responses_max_queued: int = 1000
    # OTLP/HTTP collector root for traces (reveille.tracing); "" = no traces
    otel_endpoint: str = ""
    # setting name -> where its value came from ("$VAR", "<file> [section] key", "command
    # line"); absent: the default. Filled by ``load_settings``, for errors found later.
    origins: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    # [mcp.servers.NAME] tables (tools.mcp.config): the MCP servers whose tools agents get
    mcp_servers: tuple[McpServerConfig, ...] = ()

    def origin(self, name: str) -> str:
        """Where the value of setting ``name`` came from, for an error message."""
        return self.origins.get(name, "default")

    @property
    def allowed_origins(self) -> frozenset[str]:
        return frozenset(normalize_origin(o) for o in self.cors_origins.split(",") if o.strip())

    @property
    def compaction_policy(self) -> CompactionPolicy:
        # A summarisation call is sent at most half the window (or 200k characters).
        window = self.context_window
        return CompactionPolicy(
            context_window=window,
            summary_chars=self.compaction_summary_chars,
            input_chars=window * 2 if window else 200_000,
        )

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

    @property
    def retention_policy(self) -> RetentionPolicy:
        return RetentionPolicy(
            settled_days=self.retention_settled_days,
            archived_transcript_days=self.retention_archived_transcript_days,
            idempotency_days=self.retention_idempotency_days,
            tombstone_days=self.retention_tombstone_days,
            webui_event_days=self.retention_webui_event_days,
            process_output_days=self.retention_process_output_days,
            hook_event_days=self.retention_hook_event_days,
            response_days=self.responses_keep_days,
            interval_seconds=self.retention_interval_seconds,
        )


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
    """Refuse a value Reveille cannot use, naming where it came from (``Settings.origin``)."""
    where = s.origins

    def bad(name: str, why: str) -> SettingsError:
        return SettingsError(f"{s.origin(name)}: {name} = {getattr(s, name)!r}: {why}")

    for name in ("port", "webui_port"):
        if not 0 <= getattr(s, name) <= 65535:
            raise bad(name, "must be 0-65535")
    if s.shell_approvals.strip().lower() not in {"always", "never"}:
        raise bad("shell_approvals", 'must be "always" or "never"')
    if not 1024 <= s.hooks_max_body_bytes <= 16 * 1024 * 1024:
        raise bad("hooks_max_body_bytes", "must be 1024 to 16777216 bytes")
    if not 0 <= s.hooks_rotation_overlap_seconds <= 30 * 86400:
        raise bad("hooks_rotation_overlap_seconds", "must be 0 to 2592000 seconds (30 days)")
    if not 0 <= s.hooks_lookback_seconds <= 7 * 86400:
        raise bad("hooks_lookback_seconds", "must be 0 to 604800 seconds (7 days)")
    if not 1 <= s.timers_min_delay_seconds <= 3600:
        raise bad("timers_min_delay_seconds", "must be 1-3600 seconds")
    if s.provider not in {"demo", "openai"}:
        raise bad("provider", 'must be "demo" or "openai"')
    if s.provider == "openai" and not s.openai_base_url and not s.openai_api_key:
        raise bad("provider", "openai needs OPENAI_API_KEY (and OPENAI_BASE_URL for non-OpenAI)")
    if s.provider == "openai" and "model" not in where:
        # The default names the built-in demo model, which no OpenAI endpoint serves: every
        # turn would fail at the first model call instead of the server failing at start.
        raise bad(
            "provider",
            "openai needs a model name: set REVEILLE_MODEL (or [model] name in the settings file)",
        )
    for name in (
        "max_concurrent_runs",
        "workers",
        "max_body_bytes",
        "max_async_children",
        "max_attempts",
        "delegation_max_depth",
        "delegation_max_steps",
        "responses_background_concurrency",
        "responses_max_queued_per_key",
        "responses_max_queued",
    ):
        if getattr(s, name) < 1:
            raise bad(name, "must be at least 1")
    if s.drain_seconds < 0:
        raise bad("drain_seconds", "must not be negative")
    if s.context_chars < 1000:
        raise bad("context_chars", "must be at least 1000")
    if s.context_window and s.context_window < 1000:
        raise bad("context_window", "must be 0 (unknown) or at least 1000 tokens")
    if s.compaction_summary_chars < 200:
        raise bad("compaction_summary_chars", "must be at least 200")
    if s.max_queued_delegations < 0:
        raise bad("max_queued_delegations", "must not be negative")
    if s.database_url and not s.database_url.startswith(("postgresql://", "postgres://")):
        raise bad("database_url", "expected postgresql://user:password@host/dbname (or unset)")
    for name in (
        "lease_seconds",
        "replay_cap_seconds",
        "peer_timeout_seconds",
        "delegation_stall_seconds",
        "responses_lease_seconds",
        "shell_approval_timeout",
        "client_tool_timeout",
    ):
        if getattr(s, name) <= 0:
            raise bad(name, "must be positive")
    if not 0 <= s.coalesce_seconds <= 60:
        raise bad("coalesce_seconds", "must be 0-60 (0 = combine only while a wake-up runs)")
    if s.wake_text_budget < 2000:
        raise bad("wake_text_budget", "must be at least 2000 characters")
    for key in RETENTION_KEYS:
        if getattr(s, f"retention_{key}") < 0:
            raise bad(f"retention_{key}", "must not be negative (0 keeps that kind forever)")
    if s.responses_keep_days < 0:
        raise bad("responses_keep_days", "must not be negative (0 keeps responses forever)")
    if s.retention_interval_seconds < 1:
        raise bad("retention_interval_seconds", "must be at least 1 second")
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
    if s.workers > 1 and s.discord_bot_token:
        raise bad(
            "workers",
            "Discord's Gateway sends every event to each connection of a bot, so each worker "
            "would answer every message; use REVEILLE_WORKERS=1 with DISCORD_BOT_TOKEN",
        )
    api_base = urlsplit(s.discord_api_base)
    if api_base.scheme not in ("http", "https") or not api_base.hostname:
        raise bad("discord_api_base", f"{s.discord_api_base!r} is not an http(s) URL")
    if s.slack_bot_token:
        slack_root = urlsplit(s.slack_base_url)
        if slack_root.scheme not in ("http", "https") or not slack_root.hostname:
            raise bad("slack_base_url", f"{s.slack_base_url!r} is not an http(s) URL")
        if not (s.slack_app_token or s.slack_signing_secret):
            raise bad(
                "slack_bot_token",
                "set SLACK_APP_TOKEN (Socket Mode) or SLACK_SIGNING_SECRET (the Events API)",
            )
    if s.matrix_homeserver:
        homeserver = urlsplit(s.matrix_homeserver)
        if homeserver.scheme not in ("http", "https") or not homeserver.hostname:
            raise bad("matrix_homeserver", f"{s.matrix_homeserver!r} is not an http(s) URL")
        if not s.matrix_user_id.startswith("@") or ":" not in s.matrix_user_id:
            raise bad("matrix_user_id", "the bot's Matrix id, like @bot:example.org, is required")
        if not (s.matrix_access_token or s.matrix_password):
            raise bad("matrix_access_token", "set MATRIX_ACCESS_TOKEN or MATRIX_PASSWORD")
    for url in s.webhook_endpoints:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise bad("webhook_urls", f"{url!r} is not an http(s) URL")
    if s.webhook_secret:
        try:
            check_secret(s.webhook_secret)
        except ValueError as exc:
            # the message never repeats the secret itself
            raise SettingsError(f"{s.origin('webhook_secret')}: webhook_secret: {exc}") from None
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
    origins: dict[str, str] = {}  # setting name -> where its value came from
    if env.get("REVEILLE_HOME"):
        origins["home"] = "$REVEILLE_HOME"

    path = Path(config_file or env.get("REVEILLE_CONFIG") or home / "config.toml").expanduser()
    explicit = bool(config_file or env.get("REVEILLE_CONFIG"))
    if path.exists():
        try:
            data = tomllib.loads(path.read_text())
        except (tomllib.TOMLDecodeError, OSError, UnicodeDecodeError) as exc:
            raise SettingsError(f"{path}: not valid TOML: {exc}") from None
        hook_table = data.pop("hooks", None)
        if isinstance(hook_table, dict):
            try:
                data["hooks"], values["hooks"] = parse_hook_tables(hook_table, str(path))
            except HookSettingsError as exc:
                raise SettingsError(str(exc)) from None
            origins["hooks"] = f"{path} [hooks]"
        if "mcp" in data:
            try:
                mcp = parse_servers(data.pop("mcp"), origin=str(path), environ=env)
            except McpConfigError as exc:
                raise SettingsError(str(exc)) from None
            values["mcp_servers"] = mcp
            origins["mcp_servers"] = f"{path} [mcp]"
        for section, table in data.items():
            items = table.items() if isinstance(table, dict) else [(None, table)]
            for key, value in items:
                name = TOML_ALIASES.get((section, key)) if key else section
                if (
                    name is None
                    or name not in types
                    or name in ("home", "origins", "hooks", "mcp_servers")
                ):
                    where = f"[{section}] {key}" if key else section
                    raise SettingsError(f"{path}: unknown setting {where}")
                origin = f"{path} [{section}] {key}" if key else f"{path} {section}"
                values[name] = _coerce(name, kinds[str(types[name])], value, origin)
                origins[name] = origin
    elif explicit:
        raise SettingsError(f"settings file {path} does not exist")

    for name, var in ENV_NAMES.items():
        if var in env:
            values[name] = _coerce(name, kinds[str(types[name])], env[var], f"${var}")
            origins[name] = f"${var}"
    for name, value in overrides.items():
        if value is not None:
            values[name] = _coerce(name, kinds[str(types[name])], value, "command line")
            origins[name] = "command line"
    settings = Settings(home=home, origins=origins, **values)
    _validate(settings)
    return settings
