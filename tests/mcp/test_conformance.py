"""The MCP conformance package's client scenarios (``@modelcontextprotocol/conformance``, run
by ``scripts/mcp-conformance``) against Reveille's MCP client (``scripts/mcp-conformance-client``
drives ``tools.mcp``): each scenario's server is the package's own, on loopback.

The scenarios the client passes are asserted check by check from the package's
``checks.json``. The OAuth scenarios (``auth/*``) run with ``auth = "oauth"`` (the runner
stands in for the person at the authorization endpoint, which redirects at once); each one
the client passes is asserted to end with no failed and no warning check. The few it does
not pass are listed, with why, in ``scripts/mcp-conformance-baseline.txt``.

``sse-retry`` once failed under load with ``client-sse-graceful-reconnect`` FAILURE and no
``client-sse-last-event-id`` check at all: the package reports that when it saw no GET,
not even the stream the client opens right after ``initialized``, so the client never got
that far; its reconnect (after ``retry``, with ``Last-Event-ID``) was not what failed, and
its timing check stays out of the verdict (``_TIMED``). What could stop it that early on
a slow machine was the runner's own patience: it gave up on the first connection attempt
(one that failed, or took over 20 s). The runner now waits up to 60 s for the server to be
ready, retrying on the connection's backoff as a server does, and every failure here
carries the client's log.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "mcp-conformance"

pytestmark = pytest.mark.skipif(
    shutil.which("node") is None or shutil.which("npm") is None,
    reason="node and npm run the MCP conformance package (.ci/run installs Debian's nodejs/npm)",
)

# The checks whose status is a time measured on a shared machine: a late reconnect under
# load is the machine's, not the client's; too early (ignoring ``retry``) still fails.
_TIMED = {"client-sse-retry-timing"}


def _run(scenario: str, out: Path) -> list[dict[str, object]]:
    env = {**os.environ, "REVEILLE_MCP_CONFORMANCE_OUT": str(out), "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(SCRIPT), scenario],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    (found,) = out.rglob("checks.json")
    checks: list[dict[str, object]] = json.loads(found.read_text())
    assert done.returncode in (0, 1), done.stderr
    # The client's own log rides along in the checks, so a failure shows what it did.
    client_log = found.with_name("stderr.txt")
    if client_log.exists():
        checks.append({"id": "client-stderr", "status": "INFO", "log": client_log.read_text()})
    return checks


@pytest.mark.parametrize(
    ("scenario", "expected"),
    [
        ("initialize", {"mcp-client-initialization"}),
        ("tools_call", {"tool-add-numbers"}),
        (
            "elicitation-sep1034-client-defaults",
            {
                f"client-elicitation-sep1034-{kind}-default"
                for kind in ("string", "integer", "number", "enum", "boolean")
            },
        ),
        ("sse-retry", {"client-sse-graceful-reconnect", "client-sse-last-event-id"}),
    ],
)
def test_client_scenario_passes(scenario: str, expected: set[str], tmp_path: Path) -> None:
    checks = _run(scenario, tmp_path)
    verdicts = {str(c["id"]): str(c["status"]) for c in checks if c["status"] != "INFO"}
    got = {name: verdicts.get(name) for name in expected}
    assert got == dict.fromkeys(expected, "SUCCESS"), checks
    failed = {
        name: status
        for name, status in verdicts.items()
        if status == "FAILURE" and name not in _TIMED
    }
    assert failed == {}, checks
    timing = next((c for c in checks if c["id"] in _TIMED), None)
    if timing is not None:
        details = timing.get("details")
        assert isinstance(details, dict) and not details.get("tooEarly"), timing


# Every OAuth client scenario of the package but the baseline's: discovery (RFC 9728 and
# RFC 8414 / OpenID at each location), URL-based client ids, scopes (from the challenge,
# from the metadata, omitted, step-up, retry limit), token endpoint authentication, a
# pre-registered client, the 2025-03-26 fallbacks, offline access, client credentials, and
# a resource that does not match (refused).
AUTH_PASSING = (
    "auth/metadata-default",
    "auth/metadata-var1",
    "auth/metadata-var2",
    "auth/metadata-var3",
    "auth/basic-cimd",
    "auth/scope-from-www-authenticate",
    "auth/scope-from-scopes-supported",
    "auth/scope-omitted-when-undefined",
    "auth/scope-step-up",
    "auth/scope-retry-limit",
    "auth/token-endpoint-auth-basic",
    "auth/token-endpoint-auth-post",
    "auth/token-endpoint-auth-none",
    "auth/pre-registration",
    "auth/2025-03-26-oauth-endpoint-fallback",
    "auth/offline-access-scope",
    "auth/offline-access-not-supported",
    "auth/client-credentials-basic",
    "auth/resource-mismatch",
)


@pytest.mark.parametrize("scenario", AUTH_PASSING)
def test_auth_scenario_passes(scenario: str, tmp_path: Path) -> None:
    checks = _run(scenario, tmp_path)
    bad = {str(c["id"]): c["status"] for c in checks if c["status"] in ("FAILURE", "WARNING")}
    assert bad == {}, checks
    assert any(c["status"] == "SUCCESS" for c in checks)


def _baseline() -> list[str]:
    text = (ROOT / "scripts" / "mcp-conformance-baseline.txt").read_text()
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_known_failures_are_only_oauth() -> None:
    """The baseline names only OAuth scenarios: every other client scenario must pass, and a
    scenario asserted to pass is not listed as a failure."""
    listed = _baseline()
    assert listed and all(name.startswith("auth/") for name in listed)
    assert not set(listed) & set(AUTH_PASSING)
