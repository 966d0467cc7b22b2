"""The Matrix adapter against a real Synapse (``scripts/synapse-test-server``), in process:
invites (accepted from allowed users only), a message answered with safe HTML and a plain
body beside it, an encrypted room told it is not supported, the ``/sync`` token kept in the
store, and a password login whose device is kept for the next start."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from mautrix.api import Method

import storage
import tools.async_delegation as ad
from agent.providers.demo import DemoModel
from gateway.surfaces.matrix.adapter import ENCRYPTED_NOTICE
from gateway.surfaces.matrix.client import MatrixClient
from gateway.surfaces.port import Refusal, SurfaceError
from reveille.app import App, serve
from reveille.settings import Settings
from tests.matrix import synapse
from tests.matrix.synapse import Json, User, register, wait_for
from tests.surfaces.matrix_fake import MatrixProxy
from tools.process_registry import process_registry


@pytest.fixture
def users() -> Iterator[tuple[User, User]]:
    yield register("bot"), register("me")


@asynccontextmanager
async def _serving(home: Path, bot: User, allowed: str, **login: str) -> AsyncIterator[App]:
    ad.reset_runtime()
    process_registry.completion_queue.drain()
    settings = Settings(
        home=home,
        port=0,
        webui_port=0,
        api_key="k",
        matrix_homeserver=synapse.MATRIX_URL,
        matrix_user_id=bot.user_id,
        matrix_allowed_users=allowed,
        **(login or {"matrix_access_token": bot.token}),
    )
    async with serve(
        settings, provider=DemoModel(delay_seconds=0.0), shutdown_grace_seconds=0.5
    ) as app:
        yield app
    ad.reset_runtime()
    process_registry.completion_queue.drain()


def _from(user: str, events: list[Json]) -> list[Json]:
    return [e for e in events if e.get("sender") == user and e.get("type") == "m.room.message"]


async def _until(check: object, timeout: float = 30.0) -> object:
    return await asyncio.to_thread(wait_for, check, timeout)


async def test_an_allowed_users_room_is_joined_and_answered_in_safe_html(
    tmp_path: Path, users: tuple[User, User], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REVEILLE_HOME", str(tmp_path))
    bot, me = users
    room = me.direct_room(bot.user_id)
    async with _serving(tmp_path, bot, me.user_id):
        await _until(lambda: bot.user_id in me.joined(room))
        me.say(room, "hello <b>there</b> & more")
        [reply] = await _until(lambda: _from(bot.user_id, me.events(room)))
        content = reply["content"]
        assert isinstance(content, dict)
        assert "hello <b>there</b> & more" in str(content["body"])
        assert content["format"] == "org.matrix.custom.html"
        assert "hello &lt;b&gt;there&lt;/b&gt; &amp; more" in str(content["formatted_body"])
        await asyncio.sleep(0.5)
        assert len(_from(bot.user_id, me.events(room))) == 1
    # The sync token is in the store, for the next start (or another server).
    opened = storage.open_storage(f"sqlite://{tmp_path.resolve().as_posix()}").open_telegram()
    try:
        assert opened.platform_value(f"matrix:{bot.user_id}:sync")
    finally:
        opened.close()


async def test_an_invite_from_a_stranger_is_rejected_and_their_messages_ignored(
    tmp_path: Path, users: tuple[User, User], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REVEILLE_HOME", str(tmp_path))
    bot, me = users
    stranger = register("stranger")
    room = stranger.direct_room(bot.user_id)
    async with _serving(tmp_path, bot, me.user_id):
        await _until(lambda: stranger.membership(room, bot.user_id) == "leave")


async def test_an_encrypted_room_is_told_it_is_not_supported(
    tmp_path: Path, users: tuple[User, User], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REVEILLE_HOME", str(tmp_path))
    bot, me = users
    answer = me.call(
        "POST",
        "/createRoom",
        {
            "preset": "private_chat",
            "invite": [bot.user_id],
            "is_direct": True,
            "initial_state": [
                {
                    "type": "m.room.encryption",
                    "state_key": "",
                    "content": {"algorithm": "m.megolm.v1.aes-sha2"},
                }
            ],
        },
    )
    room = str(answer["room_id"])
    async with _serving(tmp_path, bot, me.user_id):
        [notice] = await _until(lambda: _from(bot.user_id, me.events(room)))
        assert notice["content"]["body"] == ENCRYPTED_NOTICE  # type: ignore[index]


async def test_a_password_login_keeps_its_device_for_the_next_start(
    tmp_path: Path, users: tuple[User, User], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REVEILLE_HOME", str(tmp_path))
    bot, me = users
    room = me.direct_room(bot.user_id)
    async with _serving(tmp_path, bot, me.user_id, matrix_password=bot.password):
        await _until(lambda: bot.user_id in me.joined(room))
    devices = bot.call("GET", "/devices")["devices"]
    async with _serving(tmp_path, bot, me.user_id, matrix_password=bot.password):
        me.say(room, "still me")
        await _until(lambda: _from(bot.user_id, me.events(room)))
    assert bot.call("GET", "/devices")["devices"] == devices  # no second login


async def test_a_rate_limited_sync_waits_the_homeservers_retry_after(
    tmp_path: Path, users: tuple[User, User], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REVEILLE_HOME", str(tmp_path))
    bot, me = users
    proxy = MatrixProxy(synapse.MATRIX_URL, bot.token)
    monkeypatch.setattr(synapse, "MATRIX_URL", proxy.url)
    try:
        proxy.sync_limit = 2.0  # the first /sync is refused: M_LIMIT_EXCEEDED, 2,000 ms
        async with _serving(tmp_path, bot, me.user_id):
            await _until(lambda: len(proxy.syncs) >= 2)
        [refused_at] = proxy.rate_limited
        assert proxy.syncs[1] - refused_at >= 2.0  # retry_after_ms was waited out
    finally:
        proxy.stop()


async def test_a_429_carries_the_homeservers_retry_after_ms(users: tuple[User, User]) -> None:
    bot, _ = users
    proxy = MatrixProxy(synapse.MATRIX_URL, bot.token)
    client = MatrixClient(proxy.url, bot.token)
    try:
        proxy.sync_limit = 1.25
        with pytest.raises(SurfaceError) as refused:
            await client.call(Method.GET, client.v3.sync)
        assert refused.value.kind is Refusal.RATE_LIMITED
        assert refused.value.retry_after == 1.25  # from the body's retry_after_ms, not a guess
        assert "M_LIMIT_EXCEEDED" in refused.value.reason
        whoami = await client.call(Method.GET, client.v3.account.whoami)  # the next one goes
        assert whoami["user_id"] == bot.user_id
    finally:
        await client.close()
        proxy.stop()


async def test_a_group_room_answers_allowed_users_only(
    tmp_path: Path, users: tuple[User, User], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REVEILLE_HOME", str(tmp_path))
    bot, me = users
    guest = register("guest")
    room = str(
        me.call(
            "POST",
            "/createRoom",
            {"preset": "private_chat", "invite": [bot.user_id, guest.user_id]},
        )["room_id"]
    )
    guest.call("POST", f"/rooms/{synapse.q(room)}/join", {})
    async with _serving(tmp_path, bot, me.user_id) as app:
        await _until(lambda: bot.user_id in me.joined(room))
        guest.say(room, "from the guest")
        me.say(room, "from the owner")
        [reply] = await _until(lambda: _from(bot.user_id, me.events(room)))
        assert "from the owner" in str(reply["content"])
        await asyncio.sleep(0.5)
        assert len(_from(bot.user_id, me.events(room))) == 1  # the guest got nothing
        [session] = [s for s in app.store.list_sessions(10, 0) if isinstance(s.source, dict)]
        assert (session.source["chat_type"], session.source["user_id"]) == ("group", me.user_id)
