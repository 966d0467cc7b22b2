"""What `reveille serve` tells its user once it listens: where, which model (saying plainly
when that is the offline demo model), the web UI, Telegram, and a copy-paste example. Printed
by the one server, or by the supervisor of ``--workers N`` once every worker listens."""

from __future__ import annotations

from gateway.wake import url_host
from reveille.settings import Settings

__all__ = [
    "discord_summary",
    "matrix_summary",
    "shell_summary",
    "slack_summary",
    "startup_banner",
    "telegram_summary",
]


def startup_banner(
    settings: Settings,
    *,
    port: int,
    model: str,
    restored: int,
    webui_url: str | None = None,
    workers: int = 1,
) -> str:
    """What `reveille serve` tells its user once it listens."""
    url = f"http://{url_host(settings.host)}:{port}/v1"
    key = settings.api_key
    lines = [f"Reveille is listening on http://{settings.host}:{port}/v1"]
    if workers > 1:
        lines[0] += f" with {workers} workers"
        lines.append(
            f"  workers: {workers} processes share these ports and the state directory; "
            "limits such as REVEILLE_MAX_CONCURRENT_RUNS apply to each"
        )
    if webui_url:
        login = " (password: $REVEILLE_WEBUI_PASSWORD)" if settings.webui_password else ""
        lines.append(f"  web UI: {webui_url}{login}  <- open this in a browser")
    else:
        lines.append("  web UI: off (REVEILLE_WEBUI_PORT=0)")
    lines.append(f"  state directory: {settings.home}")
    if settings.provider == "demo":
        lines.append(
            f"  model: {model} -- the built-in OFFLINE DEMO model: scripted replies, not a "
            "language model. Set REVEILLE_PROVIDER=openai with OPENAI_API_KEY (and "
            "OPENAI_BASE_URL, REVEILLE_MODEL) to use a real one."
        )
        lines.append(
            "  try: 'in the background: <goal>' (a sub-agent; the result comes back to the "
            "session)"
            + (
                " or 'run in the background: <command>'"
                if settings.shell_enabled
                else " ('run in the background: <command>' needs REVEILLE_SHELL_ENABLED=1)"
            )
        )
        lines.append(
            "       'remind me in 30 seconds: <text>' (a reminder), "
            "'every 60 seconds: <text>' (a schedule; `reveille schedules list`)"
        )
    else:
        endpoint = settings.openai_base_url or "https://api.openai.com/v1"
        lines.append(f"  model: {model} via {endpoint}")
    lines.append(f"  shell tool: {shell_summary(settings)}")
    lines.append(f"  telegram: {telegram_summary(settings)}")
    lines.append(f"  discord: {discord_summary(settings)}")
    lines.append(f"  matrix: {matrix_summary(settings)}")
    lines.append(f"  slack: {slack_summary(settings)}")
    lines.append(
        f"  metrics: http://{url_host(settings.host)}:{port}/metrics (Prometheus"
        + (", bearer key required)" if key else ")")
    )
    if key:
        lines.append("  API key: required (Authorization: Bearer $API_SERVER_KEY)")
    else:
        lines.append(
            "  API key: none -- loopback only; continuing a session by X-Hermes-Session-Id "
            "is refused until API_SERVER_KEY is set"
        )
    if restored:
        lines.append(f"  re-offering {restored} undelivered completion(s) from an earlier run")
    shown_key = "$API_SERVER_KEY" if key else "unused"
    py_key = 'os.environ["API_SERVER_KEY"]' if key else '"unused"'
    lines += [
        "",
        "Talk to it:",
        f"  bash scripts/reveille chat --url {url}"
        + (" --key $API_SERVER_KEY" if key else "")
        + "   (from the checkout; `reveille chat` where the package is installed)",
        f"  curl -s {url}/chat/completions -H 'Content-Type: application/json' \\",
        *([f'    -H "Authorization: Bearer {shown_key}" \\'] if key else []),
        f'    -d \'{{"model": "{model}", "messages": [{{"role": "user", "content": "hello"}}]}}\'',
        "  python -c 'import os; from openai import OpenAI; "
        f'c = OpenAI(base_url="{url}", api_key={py_key}); '
        f'print(c.chat.completions.create(model="{model}", '
        'messages=[{"role": "user", "content": "hello"}]).choices[0].message.content)\'',
    ]
    return "\n".join(lines)


def telegram_summary(settings: Settings) -> str:
    """The banner's Telegram line: off, or how updates arrive and who may talk to the bot."""
    if not settings.telegram_bot_token:
        return "off (set TELEGRAM_BOT_TOKEN to start the bot)"
    mode = (
        f"webhook at {settings.telegram_webhook_url}"
        if settings.telegram_webhook_url
        else "long polling"
    )
    users = sorted(settings.telegram_allowed_user_ids)
    who = f"allowed users {', '.join(users)}" if users else "NO allowed users: it answers nobody"
    return f"{mode} via {settings.telegram_base_url}; {who}"


def discord_summary(settings: Settings) -> str:
    """The banner's Discord line: off, or where the bot connects and who may talk to it."""
    if not settings.discord_bot_token:
        return "off (set DISCORD_BOT_TOKEN to start the bot)"
    users = sorted(settings.discord_allowed_user_ids)
    who = f"allowed users {', '.join(users)}" if users else "NO allowed users: it answers nobody"
    return f"Gateway via {settings.discord_api_base}; {who}"


def matrix_summary(settings: Settings) -> str:
    """The banner's Matrix line: off, or which homeserver and account, and who may talk."""
    if not settings.matrix_homeserver:
        return "off (set MATRIX_HOMESERVER to start the bot)"
    users = sorted(settings.matrix_allowed_user_ids)
    who = f"allowed users {', '.join(users)}" if users else "NO allowed users: it answers nobody"
    return f"{settings.matrix_user_id} on {settings.matrix_homeserver}; {who}"


def slack_summary(settings: Settings) -> str:
    """The banner's Slack line: off, or how events arrive and who may talk to the bot."""
    if not settings.slack_bot_token:
        return "off (set SLACK_BOT_TOKEN to start the bot)"
    modes = ["Socket Mode"] if settings.slack_app_token else []
    if settings.slack_signing_secret:
        modes.append("the Events API at /slack/events")
    users = sorted(settings.slack_allowed_user_ids)
    who = f"allowed users {', '.join(users)}" if users else "NO allowed users: it answers nobody"
    return f"{' and '.join(modes)} via {settings.slack_base_url}; {who}"


def shell_summary(settings: Settings) -> str:
    """The banner's shell line: off, on with approvals, or plainly on WITHOUT them."""
    if not settings.shell_enabled:
        return "off"
    if settings.shell_asks:
        return (
            "ENABLED, each command waits for a person's approval (web UI, API "
            "/api/approvals, Telegram buttons, `reveille approvals`)"
        )
    return (
        "ENABLED WITHOUT APPROVALS -- every surface (API, Telegram, web UI) runs any command "
        'the model writes at once ([shell] approvals = "never"; set it to "always" to ask)'
    )
