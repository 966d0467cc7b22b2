"""`reveille webhooks` and the webhook settings, run as a user would (real subprocesses):
the secret is created once, shown again, rotated with the old one kept for 24 h; a webhook's
rows and attempts show under `reveille deliveries show <evt_...>`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import storage
from delivery.webhooks_backend import (
    DROPPED,
    PENDING,
    Settlement,
    WebhookAttempt,
    WebhookDelivery,
)
from gateway.webhooks import check_secret, new_secret
from reveille.settings import SettingsError, load_settings


def reveille(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("REVEILLE_WEBHOOK")}
    environ.update(REVEILLE_HOME=str(home), **env)
    return subprocess.run(
        [sys.executable, "-m", "reveille.cli", *args],
        capture_output=True,
        text=True,
        env=environ,
        timeout=60,
    )


def test_the_secret_is_created_once_and_rotated_with_overlap(tmp_path: Path) -> None:
    first = reveille(tmp_path, "webhooks", "secret")
    assert first.returncode == 0, first.stderr
    secret = first.stdout.strip()
    assert check_secret(secret) == secret
    again = reveille(tmp_path, "webhooks", "secret")
    assert again.stdout.strip() == secret
    assert (tmp_path / "ledger.db").stat().st_mode & 0o077 == 0  # kept in the private store

    rotated = reveille(tmp_path, "webhooks", "secret", "--rotate")
    assert rotated.returncode == 0, rotated.stderr
    new = rotated.stdout.strip()
    assert new != secret and "keeps signing until" in rotated.stderr
    store = storage.sqlite_files(ledger=tmp_path / "ledger.db").open_webhooks()
    try:
        valid = store.secrets(time.time())
        assert [s.secret for s in valid] == [new, secret]
        assert valid[1].expires_at is not None
        assert 23.9 * 3600 < valid[1].expires_at - time.time() <= 24 * 3600
        assert [s.secret for s in store.secrets(time.time() + 24 * 3600 + 1)] == [new]
    finally:
        store.close()


def test_a_configured_secret_is_not_managed_here(tmp_path: Path) -> None:
    done = reveille(tmp_path, "webhooks", "secret", REVEILLE_WEBHOOK_SECRET=new_secret())
    assert done.returncode == 1 and "change it there" in done.stderr
    assert done.stdout == ""


def test_deliveries_show_a_webhook_with_every_attempt(tmp_path: Path) -> None:
    store = storage.sqlite_files(ledger=tmp_path / "ledger.db").open_webhooks()
    body = '{"object":"event","id":"evt_42"}'
    now = time.time()
    rows = [
        WebhookDelivery("evt_42", url, "response.completed", "resp_9", body, now)
        for url in ("http://a.test/hook", "http://b.test/hook")
    ]
    try:
        store.add(rows)
        store.claim_due(now, "srv", "tok", 60, 10)
        a, b = rows
        store.settle(
            WebhookAttempt(a.id, a.endpoint, now, "srv", "retry", None, "ClientConnectorError"),
            "tok",
            Settlement(PENDING, next_attempt_at=now),
        )
        store.settle(
            WebhookAttempt(b.id, b.endpoint, now, "srv", "dropped", 410),
            "tok",
            Settlement(DROPPED, reason="HTTP 410 Gone: the endpoint stopped it"),
        )
    finally:
        store.close()
    shown = reveille(tmp_path, "deliveries", "show", "evt_42")
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "response.completed" in out and "resp_9" in out
    assert "http://a.test/hook" in out and "ClientConnectorError" in out
    assert "dropped  HTTP 410 Gone" in out and "HTTP 410" in out
    as_json = json.loads(reveille(tmp_path, "deliveries", "show", "evt_42", "--json").stdout)
    assert [d["state"] for d in as_json["deliveries"]] == ["pending", "dropped"]
    assert len(as_json["attempts"]) == 2
    listed = reveille(tmp_path, "webhooks", "list", "--state", "dropped")
    assert "evt_42" in listed.stdout and "http://b.test/hook" in listed.stdout
    assert "http://a.test/hook" not in listed.stdout
    missing = reveille(tmp_path, "deliveries", "show", "evt_nope")
    assert missing.returncode == 1 and "no webhook" in missing.stderr


def test_looking_at_a_fresh_home_creates_no_store(tmp_path: Path) -> None:
    listed = reveille(tmp_path, "webhooks", "list")
    assert listed.returncode == 0 and "no webhook deliveries" in listed.stdout
    shown = reveille(tmp_path, "deliveries", "show", "evt_0123456789abcdef")
    assert shown.returncode == 1 and "no ledger" in shown.stdout
    assert not (tmp_path / "ledger.db").exists()


def test_webhook_settings_from_the_file_and_the_environment(tmp_path: Path) -> None:
    secret = new_secret()
    (tmp_path / "config.toml").write_text(
        f'[webhooks]\nurls = ["https://a.example/hook", "http://10.0.0.2:9000/x"]\n'
        f'secret = "{secret}"\n'
    )
    s = load_settings({"REVEILLE_HOME": str(tmp_path)})
    assert s.webhook_endpoints == ("https://a.example/hook", "http://10.0.0.2:9000/x")
    assert s.webhook_secret == secret
    s = load_settings(
        {"REVEILLE_HOME": str(tmp_path), "REVEILLE_WEBHOOK_URLS": "https://b.example/h, "}
    )
    assert s.webhook_endpoints == ("https://b.example/h",)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"REVEILLE_WEBHOOK_URLS": "ftp://a.example/"}, r"is not an http\(s\) URL"),
        ({"REVEILLE_WEBHOOK_SECRET": "sk_not_a_webhook_secret"}, "starts with whsec_"),
        ({"REVEILLE_WEBHOOK_SECRET": "whsec_!!notbase64!!"}, "not valid base64"),
        ({"REVEILLE_WEBHOOK_SECRET": "whsec_c2hvcnQ="}, "24 to 64 bytes"),
    ],
)
def test_bad_webhook_settings_are_refused(
    tmp_path: Path, env: dict[str, str], message: str
) -> None:
    with pytest.raises(SettingsError, match=message) as raised:
        load_settings({"REVEILLE_HOME": str(tmp_path), **env})
    secret = env.get("REVEILLE_WEBHOOK_SECRET")
    assert secret is None or secret not in str(raised.value)  # never echoed
