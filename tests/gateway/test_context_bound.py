"""The model's context is bounded: a long conversation never sends its whole history."""

from __future__ import annotations

from agent.markers import DELIVERY_MARKER
from gateway.turns.conversation import bound_context


def _msgs(n: int, size: int) -> list[dict[str, str]]:
    return [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"{i}:" + "x" * size}
        for i in range(n)
    ]


def _size(context: list[dict[str, str]]) -> int:
    return sum(len(m["content"]) for m in context)


def test_a_short_context_is_untouched() -> None:
    context = [{"role": "system", "content": "be brief"}, *_msgs(5, 10)]
    assert bound_context(context, 10_000) is context


def test_the_oldest_history_goes_first_and_a_note_says_so() -> None:
    system = {"role": "system", "content": "be brief"}
    folded = {"role": "system", "content": f"{DELIVERY_MARKER} a result"}
    new = {"role": "user", "content": "and now?"}
    context = [system, *_msgs(100, 1000), folded, new]
    bounded = bound_context(context, 20_000)
    assert _size(bounded) <= 20_000
    assert bounded[0] == system and bounded[-2:] == [folded, new]
    assert "earlier message(s) of this conversation are left out" in bounded[1]["content"]
    kept = [m["content"].split(":")[0] for m in bounded[2:-2]]
    assert kept == [str(i) for i in range(100 - len(kept), 100)]  # the newest, in order


def test_a_huge_new_message_keeps_its_head_and_tail() -> None:
    huge = "HEAD" + "y" * 5_000_000 + "TAIL"
    bounded = bound_context([*_msgs(3, 10), {"role": "user", "content": huge}], 50_000)
    text = bounded[-1]["content"]
    assert _size(bounded) <= 50_000 + 100
    assert text.startswith("HEAD") and text.endswith("TAIL") and "characters left out" in text


async def test_a_long_conversation_sends_the_model_a_bounded_context(tmp_path, monkeypatch) -> None:
    """Through the real API server: a session whose transcript is far over the budget."""
    from agent.providers.demo import DemoModel
    from reveille.app import serve
    from reveille.settings import Settings
    from tests.api_server._support import KEY, RecordingProvider, client_for
    from tools.async_delegation import reset_runtime

    monkeypatch.setenv("REVEILLE_HOME", str(tmp_path))
    settings = Settings(home=tmp_path, port=0, webui_port=0, api_key=KEY, context_chars=5_000)
    provider = RecordingProvider(DemoModel(delay_seconds=0))
    try:
        async with serve(settings, provider=provider) as app:
            client = client_for(app.adapter.port)
            session = None
            for i in range(12):
                raw = await client.chat.completions.with_raw_response.create(
                    model="reveille-demo",
                    messages=[{"role": "user", "content": f"turn {i} " + "z" * 1_000}],
                    extra_headers={"X-Hermes-Session-Id": session} if session else None,
                )
                session = raw.headers["X-Hermes-Session-Id"]
            assert len(app.store.messages(session)) == 24  # everything is stored
            sent = provider.contexts[-1]
            assert sum(len(m["content"] or "") for m in sent) <= 5_000
            assert sent[-1]["content"].startswith("turn 11 ")
    finally:
        reset_runtime()
