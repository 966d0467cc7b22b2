"""Real Synapse users for the Matrix tests (``scripts/synapse-test-server start`` prints the
server's URL and its registration shared secret).

``REVEILLE_TEST_MATRIX_URL`` and ``REVEILLE_TEST_MATRIX_SECRET`` name the server; without them
the Matrix tests skip, except in CI (``CI`` set), where a missing server is a failure (as
``tests/pg_support.py``). Each ``User`` is registered under a fresh name through the admin
shared-secret API, so tests never share users or rooms. Calls are plain blocking HTTP: the
tests drive the users from their own thread, as a person's client would.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

import pytest

MATRIX_URL = os.environ.get("REVEILLE_TEST_MATRIX_URL", "")
MATRIX_SECRET = os.environ.get("REVEILLE_TEST_MATRIX_SECRET", "")

Json = dict[str, object]


def require_matrix() -> str:
    if not (MATRIX_URL and MATRIX_SECRET):
        if os.environ.get("CI"):
            pytest.fail("CI is set but REVEILLE_TEST_MATRIX_URL is not: Matrix tests must run")
        pytest.skip('no Synapse test server (eval "$(scripts/synapse-test-server start)")')
    return MATRIX_URL


class MatrixHTTPError(RuntimeError):
    def __init__(self, status: int, body: Json) -> None:
        super().__init__(f"{status}: {body}")
        self.status = status
        self.body = body


def request(
    method: str, path: str, body: Json | None = None, *, token: str = "", base: str = ""
) -> Json:
    url = (base or MATRIX_URL) + path
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return dict(json.loads(resp.read() or b"{}"))
    except urllib.error.HTTPError as exc:
        raise MatrixHTTPError(exc.code, dict(json.loads(exc.read() or b"{}"))) from exc


def q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


@dataclass
class User:
    """A registered Synapse user and what it does with its own access token."""

    user_id: str
    token: str
    password: str
    rooms: dict[str, str] = field(default_factory=dict)  # with whom -> room id

    def call(self, method: str, path: str, body: Json | None = None) -> Json:
        return request(method, "/_matrix/client/v3" + path, body, token=self.token)

    def direct_room(self, other: str) -> str:
        """A direct room of this user with ``other`` (invited), made once."""
        if other not in self.rooms:
            answer = self.call(
                "POST",
                "/createRoom",
                {"preset": "private_chat", "invite": [other], "is_direct": True},
            )
            self.rooms[other] = str(answer["room_id"])
        return self.rooms[other]

    def send(self, room_id: str, content: Json, kind: str = "m.room.message") -> str:
        txn = secrets.token_hex(8)
        answer = self.call("PUT", f"/rooms/{q(room_id)}/send/{kind}/{txn}", content)
        return str(answer["event_id"])

    def say(self, room_id: str, text: str) -> str:
        return self.send(room_id, {"msgtype": "m.text", "body": text})

    def react(self, room_id: str, event_id: str, key: str) -> str:
        relates = {"rel_type": "m.annotation", "event_id": event_id, "key": key}
        return self.send(room_id, {"m.relates_to": relates}, kind="m.reaction")

    def events(self, room_id: str) -> list[Json]:
        """The room's events, oldest first (up to 1,000)."""
        answer = self.call("GET", f"/rooms/{q(room_id)}/messages?dir=b&limit=1000")
        chunk = answer.get("chunk")
        return list(reversed(chunk)) if isinstance(chunk, list) else []

    def joined(self, room_id: str) -> list[str]:
        answer = self.call("GET", f"/rooms/{q(room_id)}/joined_members")
        joined = answer.get("joined")
        return sorted(joined) if isinstance(joined, dict) else []

    def membership(self, room_id: str, user_id: str) -> str:
        try:
            answer = self.call("GET", f"/rooms/{q(room_id)}/state/m.room.member/{q(user_id)}")
        except MatrixHTTPError as exc:
            if exc.status == 404:
                return ""
            raise
        return str(answer.get("membership") or "")


def register(prefix: str = "u", *, admin: bool = False) -> User:
    """A new user on the test server, registered by the shared secret."""
    require_matrix()
    name = f"{prefix}{secrets.token_hex(4)}"
    password = secrets.token_hex(8)
    nonce = str(request("GET", "/_synapse/admin/v1/register")["nonce"])
    mac = hmac.new(MATRIX_SECRET.encode(), digestmod=hashlib.sha1)
    mac.update(f"{nonce}\0{name}\0{password}\0{'admin' if admin else 'notadmin'}".encode())
    answer = request(
        "POST",
        "/_synapse/admin/v1/register",
        {
            "nonce": nonce,
            "username": name,
            "password": password,
            "admin": admin,
            "mac": mac.hexdigest(),
        },
    )
    return User(str(answer["user_id"]), str(answer["access_token"]), password)


def wait_for(check: object, timeout: float = 30.0) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = check() if callable(check) else check
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.1)
