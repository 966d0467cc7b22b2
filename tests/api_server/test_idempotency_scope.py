"""Idempotency keys cannot be used to read another conversation's reply or to pre-claim a
wake-up: records are scoped by session, and the server's own wake-ups live in a namespace
only this process can write to."""

from __future__ import annotations

import aiohttp

from gateway.wake import deliver_wake
from tests.api_server._support import KEY, running_adapter
from tests.sessions._support import make_session

HEADER = "X-Hermes-Session-Id"


async def _turn(port: int, text: str, *, key: str, session_id: str | None = None) -> dict:
    headers = {"Authorization": f"Bearer {KEY}", "Idempotency-Key": key}
    if session_id:
        headers[HEADER] = session_id
    body = {"model": "reveille-demo", "messages": [{"role": "user", "content": text}]}
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"http://127.0.0.1:{port}/v1/chat/completions", json=body, headers=headers
        ) as resp,
    ):
        assert resp.status == 200, await resp.text()
        return {"session": resp.headers[HEADER], **(await resp.json())}


def _reply(answer: dict) -> str:
    return answer["choices"][0]["message"]["content"]


async def test_a_client_cannot_pre_claim_a_wake_up(store) -> None:
    async with running_adapter(store) as (adapter, _provider, runner):
        session = make_session(store).id
        # The attacker knows the process id (it is shown in replies) and sends it first.
        squatted = await _turn(adapter.port, "hello", key="proc_0123abcd", session_id=session)
        woke = await deliver_wake(
            adapter,
            text="[Background process finished] exit code 0.",
            session_id=session,
            idempotency_key="proc_0123abcd",
        )
        assert woke is not None and _reply(woke) != _reply(squatted)
        assert runner.calls == 2  # the wake-up turn really ran
        again = await deliver_wake(
            adapter,
            text="[Background process finished] exit code 0.",
            session_id=session,
            idempotency_key="proc_0123abcd",
        )
        assert again is not None and _reply(again) == _reply(woke)  # and only once
        assert runner.calls == 2
        roles = [m.role for m in store.messages(session)]
        assert roles == ["user", "assistant", "user", "assistant"]


async def test_a_reused_key_never_answers_with_another_conversations_reply(store) -> None:
    async with running_adapter(store) as (adapter, _provider, runner):
        alice = await _turn(adapter.port, "my secret is 42", key="k-1")
        bob = await _turn(adapter.port, "what is the weather", key="k-1")
        assert bob["session"] != alice["session"]
        assert "42" not in _reply(bob)
        assert runner.calls == 2
        # The same request again in Alice's conversation is her replay, not a new turn.
        replay = await _turn(adapter.port, "my secret is 42", key="k-1")
        assert _reply(replay) == _reply(alice) and runner.calls == 2


async def test_a_key_reused_with_another_request_is_refused(store) -> None:
    async with running_adapter(store) as (adapter, _provider, runner):
        session = make_session(store).id
        first = await _turn(adapter.port, "deploy to staging", key="k-2", session_id=session)
        headers = {"Authorization": f"Bearer {KEY}", "Idempotency-Key": "k-2", HEADER: session}
        body = {
            "model": "reveille-demo",
            "messages": [{"role": "user", "content": "deploy to prod"}],
        }
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                f"http://127.0.0.1:{adapter.port}/v1/chat/completions", json=body, headers=headers
            ) as resp,
        ):
            assert resp.status == 422
            error = (await resp.json())["error"]
            assert error["code"] == "idempotency_key_reused"
            assert _reply(first) not in error["message"]
        assert runner.calls == 1
        assert len(store.messages(session)) == 2  # nothing written for the refused request


async def test_a_re_rendered_wake_up_is_still_the_same_wake_up(store) -> None:
    async with running_adapter(store) as (adapter, _provider, runner):
        session = make_session(store).id
        first = await deliver_wake(adapter, text="done", session_id=session, idempotency_key="d1")
        # Re-offered after a restart, its text says so; the delivery id is the same.
        again = await deliver_wake(
            adapter, text="done (re-delivered)", session_id=session, idempotency_key="d1"
        )
        assert first is not None and again is not None
        assert _reply(again) == _reply(first) and runner.calls == 1
