"""The Telegram pieces on their own: formatting, error classes, state, webhook, settings."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.surfaces.telegram.api import TelegramApi, TelegramError
from gateway.surfaces.telegram.format import escape, split_message, utf16_len
from gateway.surfaces.telegram.intake import SECRET_HEADER, webhook_handler
from gateway.surfaces.telegram.state import TelegramState
from reveille.settings import SettingsError, load_settings
from tests.stores import telegram_backend
from tests.telegram.fake_bot_api import FakeBotApi

# ----------------------------------------------------------------- formatting


def test_escape_makes_markup_literal():
    assert escape("<b>x</b> & <i") == "&lt;b&gt;x&lt;/b&gt; &amp; &lt;i"


def test_short_text_is_one_piece():
    assert split_message("hello") == ["hello"]


def test_long_text_splits_on_paragraphs_and_every_piece_fits():
    paragraphs = [("word " * 150).strip() for _ in range(12)]  # ~750 chars each
    text = "\n\n".join(paragraphs)
    pieces = split_message(text)
    assert len(pieces) > 1
    assert all(utf16_len(escape(p)) <= 4096 for p in pieces)
    assert "\n\n".join(pieces) == text  # cut only at paragraph breaks
    assert all(p in paragraphs or "\n\n" in p or p == paragraphs[0] for p in pieces)


def test_escaping_is_counted_before_splitting():
    text = "<" * 5000  # 20,000 characters once escaped
    pieces = split_message(text)
    assert all(len(escape(p)) <= 4096 for p in pieces)
    assert "".join(pieces) == text


def test_utf16_length_counts_astral_characters_twice():
    text = "😀" * 3000  # 6,000 UTF-16 units
    pieces = split_message(text)
    assert len(pieces) == 2
    assert all(utf16_len(p) <= 4096 for p in pieces)
    assert "".join(pieces) == text


def test_a_word_longer_than_a_message_is_cut_hard():
    text = "x" * 9000
    assert [len(p) for p in split_message(text)] == [4096, 4096, 808]


# ----------------------------------------------------------------- error classes


@pytest.mark.parametrize(
    ("code", "description", "transient", "gone"),
    [
        (429, "Too Many Requests: retry after 3", True, False),
        (500, "Internal Server Error", True, False),
        (502, "Bad Gateway", True, False),
        (None, "ClientConnectorError", True, False),
        (403, "Forbidden: bot was blocked by the user", False, True),
        (400, "Bad Request: chat not found", False, True),
        (400, "Bad Request: can't parse entities", False, False),
    ],
)
def test_error_classes(code, description, transient, gone):
    exc = TelegramError("sendMessage", code, description)
    assert exc.transient is transient
    assert exc.gone is gone


async def test_client_reads_the_bot_api_error_shape():
    bot = FakeBotApi().start()
    api = TelegramApi(bot.token, base_url=bot.base_url)
    try:
        assert (await api.call("getMe"))["is_bot"] is True
        bot.fail("sendMessage", 429, "Too Many Requests: retry after 7", retry_after=7)
        with pytest.raises(TelegramError) as info:
            await api.call("sendMessage", {"chat_id": 1, "text": "x"})
        assert info.value.error_code == 429
        assert info.value.retry_after == 7
        assert bot.token not in str(info.value)
        sent = await api.call("sendMessage", {"chat_id": 1, "text": "x"})
        with pytest.raises(TelegramError) as info:
            await api.call(
                "editMessageText", {"chat_id": 1, "message_id": sent["message_id"], "text": "x"}
            )
        assert info.value.not_modified
    finally:
        await api.close()
        bot.stop()
    with pytest.raises(TelegramError) as info:  # nobody listens any more
        await TelegramApi(bot.token, base_url=bot.base_url).call("getMe")
    assert info.value.error_code is None and info.value.transient


# ----------------------------------------------------------------- state


def _state(directory: Path) -> TelegramState:
    return TelegramState(telegram_backend("sqlite", directory))


def _unanswered(state: TelegramState) -> list[int]:
    return [u.update_id for u in state.backend.unanswered("b")]


def test_updates_and_offset_move_together(tmp_path: Path):
    state = _state(tmp_path)
    updates = [{"update_id": 7, "message": {}}, {"update_id": 5, "message": {}}]
    assert [u for u, _ in state.take_updates("b", updates)] == [5, 7]
    assert state.next_offset("b") == 8
    assert state.take_updates("b", updates) == []  # handed out twice: taken once
    state.mark_answered("b", 5)
    state.close()
    again = _state(tmp_path)
    assert _unanswered(again) == [7]
    again.record_part("k", 0, "1", 99)
    assert again.reply_parts("k") == {0: 99}
    assert not again.reply_finished("k")
    again.finish_reply("k")
    assert again.reply_finished("k")
    again.close()


# ----------------------------------------------------------------- webhook


async def test_webhook_checks_the_secret_and_stores_the_update(tmp_path: Path):
    state = _state(tmp_path)
    seen: list[int] = []
    app = web.Application()
    app.router.add_post("/hook", webhook_handler(state, "b", "s3cret", lambda u, _: seen.append(u)))
    async with TestClient(TestServer(app)) as client:
        update = {"update_id": 11, "message": {"text": "hi"}}
        resp = await client.post("/hook", data=json.dumps(update))
        assert resp.status == 401
        resp = await client.post("/hook", data=json.dumps(update), headers={SECRET_HEADER: "nope"})
        assert resp.status == 401
        for _ in range(2):  # Telegram retrying the same update: taken once
            resp = await client.post(
                "/hook", data=json.dumps(update), headers={SECRET_HEADER: "s3cret"}
            )
            assert resp.status == 200
    assert seen == [11]
    assert _unanswered(state) == [11]
    state.close()


async def test_webhook_skips_updates_with_impossible_ids_and_records_them_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """A webhook update Reveille can never take is answered 200 (Telegram resends a refused
    one and holds every later update back behind it), logged once, and not stored; a huge
    id used to fail the inbox write with a 500."""
    caplog.set_level("WARNING", logger="gateway.surfaces.telegram.intake")
    state = _state(tmp_path)
    seen: list[int] = []
    app = web.Application()
    app.router.add_post("/hook", webhook_handler(state, "b", "s3cret", lambda u, _: seen.append(u)))
    bad: list[dict] = [
        {"update_id": ident, "message": {"text": "x"}}
        for ident in (-1, 2**63, 2**70, "12", 12.0, True, None)
    ] + [{"message": {"text": "no id"}}]
    async with TestClient(TestServer(app)) as client:
        for _ in range(2):  # resent: answered the same, recorded once
            for update in bad:
                resp = await client.post(
                    "/hook", data=json.dumps(update), headers={SECRET_HEADER: "s3cret"}
                )
                assert resp.status == 200, update
        good = {"update_id": 13, "message": {"text": "hi"}}
        resp = await client.post("/hook", data=json.dumps(good), headers={SECRET_HEADER: "s3cret"})
        assert resp.status == 200
    assert seen == [13]
    assert _unanswered(state) == [13]
    assert len([r for r in caplog.records if "skipped" in r.getMessage()]) == len(bad)
    state.close()


def test_take_updates_leaves_out_ids_the_inbox_cannot_hold(tmp_path: Path):
    state = _state(tmp_path)
    updates = [{"update_id": 2**63}, {"update_id": -3}, {"update_id": 9}, {"update_id": "10"}]
    assert [u for u, _ in state.take_updates("b", updates)] == [9]
    assert state.next_offset("b") == 10
    state.close()


async def test_a_malformed_secret_header_is_a_401_never_a_500(tmp_path: Path):
    state = _state(tmp_path)
    app = web.Application()
    app.router.add_post("/hook", webhook_handler(state, "b", "s3cret", lambda u, _: None))
    server = TestServer(app)
    await server.start_server()
    body = json.dumps({"update_id": 12}).encode()
    malformed = [
        b"X-Telegram-Bot-Api-Secret-Token: \xff\xfe\xfd\r\n",  # not UTF-8
        b"X-Telegram-Bot-Api-Secret-Token: s3cr\xc3t\r\n",  # broken UTF-8
        b"X-Telegram-Bot-Api-Secret-Token: \xc3\xa9\r\n",  # UTF-8, not ASCII
        b"X-Telegram-Bot-Api-Secret-Token: s3cret\r\nX-Telegram-Bot-Api-Secret-Token: s3cret\r\n",
        b"X-Telegram-Bot-Api-Secret-Token: \r\n",  # empty
        b"X-Telegram-Bot-Api-Secret-Token: " + b"s" * 6000 + b"\r\n",  # long
    ]
    try:
        for header in malformed:
            reader, writer = await asyncio.open_connection(server.host, server.port)
            writer.write(
                b"POST /hook HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                + header
                + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
            status_line = await asyncio.wait_for(reader.readline(), 5)
            writer.close()
            assert int(status_line.split()[1]) in (400, 401), (header, status_line)
        assert _unanswered(state) == []
    finally:
        await server.close()
        state.close()


def test_webhook_mode_refuses_to_start_without_a_secret(tmp_path: Path):
    with pytest.raises(ValueError):
        webhook_handler(_state(tmp_path), "b", "", lambda u, _: None)
    env = {
        "REVEILLE_HOME": str(tmp_path),
        "TELEGRAM_BOT_TOKEN": "1:x",
        "TELEGRAM_WEBHOOK_URL": "https://bot.example/telegram",
    }
    with pytest.raises(SettingsError, match="secret_token"):
        load_settings(env)
    assert load_settings({**env, "TELEGRAM_SECRET_TOKEN": "s"}).telegram_secret_token == "s"


def test_telegram_settings_from_toml(tmp_path: Path):
    (tmp_path / "config.toml").write_text(
        '[telegram]\nbot_token = "1:x"\nbase_url = "http://127.0.0.1:9"\nallowed_users = [42, 43]\n'
    )
    settings = load_settings({"REVEILLE_HOME": str(tmp_path)})
    assert settings.telegram_bot_token == "1:x"
    assert settings.telegram_base_url == "http://127.0.0.1:9"
    assert settings.telegram_allowed_user_ids == frozenset({"42", "43"})
    env = {"REVEILLE_HOME": str(tmp_path), "TELEGRAM_ALLOWED_USERS": "7, 8"}
    assert load_settings(env).telegram_allowed_user_ids == frozenset({"7", "8"})


# ----------------------------------------------------------------- hostile nesting

DEEP = b'{"update_id": 14, "message": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"


async def test_a_deeply_nested_webhook_update_is_skipped_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """A 100,000-deep JSON update was a 500 with a RecursionError traceback; now it is
    skipped (answered, so Telegram does not hold later updates behind it), logged once
    however often it comes, never stored, and the next update is taken."""
    caplog.set_level("WARNING")
    state = _state(tmp_path)
    seen: list[int] = []
    app = web.Application()
    app.router.add_post("/hook", webhook_handler(state, "b", "s3cret", lambda u, _: seen.append(u)))
    async with TestClient(TestServer(app)) as client:
        for _ in range(2):
            resp = await client.post("/hook", data=DEEP, headers={SECRET_HEADER: "s3cret"})
            assert resp.status == 200
            assert (await resp.json())["description"] == "skipped"
        good = {"update_id": 15, "message": {"text": "hi"}}
        resp = await client.post("/hook", data=json.dumps(good), headers={SECRET_HEADER: "s3cret"})
        assert resp.status == 200
    assert seen == [15]
    warnings = [r for r in caplog.records if "nested" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelname == "WARNING"
    assert not [r for r in caplog.records if r.exc_info]
    state.close()


async def test_a_deeply_nested_bot_api_answer_is_a_telegram_error_not_a_recursion_error():
    async def deep(request: web.Request) -> web.Response:
        body = b'{"ok": true, "result": [' + DEEP + b"]}"
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_post("/bottok/getUpdates", deep)
    async with TestServer(app) as server:
        api = TelegramApi("tok", base_url=str(server.make_url("")).rstrip("/"))
        try:
            with pytest.raises(TelegramError) as info:
                await api.call("getUpdates", {})
            assert "nested" in str(info.value)
        finally:
            await api.close()


# ----------------------------------------------------------------- polling conflicts


async def test_a_409_conflict_is_logged_once_with_its_cause_then_at_debug(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """Two servers on one bot token: every getUpdates of the second is a 409. That logged an
    ERROR line each retry (21 in 90 s); now the first says what it is, the rest are DEBUG,
    and a conflict that comes back after a good poll is reported again, once."""
    from gateway.surfaces.telegram.intake import LongPoller

    caplog.set_level("DEBUG", logger="gateway.surfaces.telegram.intake")
    bot = FakeBotApi().start()
    api = TelegramApi(bot.token, base_url=bot.base_url)
    state = _state(tmp_path)
    conflict = "Conflict: terminated by other getUpdates request"
    for _ in range(6):
        bot.fail("getUpdates", 409, conflict)
    seen: list[int] = []
    poller = LongPoller(api, state, lambda u, _: seen.append(u), timeout=0, backoff_seconds=0.001)
    task = asyncio.create_task(poller.run())
    try:
        await api.call("getMe")
        while poller.conflicts < 6:
            await asyncio.sleep(0.01)
        bot.message("between")
        while not seen:
            await asyncio.sleep(0.01)
        bot.fail("getUpdates", 409, conflict)
        bot.fail("getUpdates", 409, conflict)
        while poller.conflicts < 8:
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await api.close()
        state.close()
        bot.stop()
    conflicts = [r for r in caplog.records if "409" in r.getMessage()]
    loud = [r for r in conflicts if r.levelno > 10]
    assert len(loud) == 2, [(r.levelname, r.getMessage()) for r in conflicts]
    assert all("another process polls this bot token" in r.getMessage() for r in loud)
    assert all(conflict in r.getMessage() for r in loud)
    assert len(conflicts) == 8  # the others are still there, at DEBUG


async def test_the_fake_answers_the_older_of_two_concurrent_polls_with_409():
    """As Telegram does with two pollers of one token (what the polling lease prevents)."""
    bot = FakeBotApi().start()
    older = TelegramApi(bot.token, base_url=bot.base_url)
    newer = TelegramApi(bot.token, base_url=bot.base_url)
    try:
        first = asyncio.create_task(older.call("getUpdates", {"timeout": 1}))
        while not bot.calls_of("getUpdates"):
            await asyncio.sleep(0.01)
        assert await newer.call("getUpdates", {"timeout": 0}) == []
        with pytest.raises(TelegramError) as info:
            await first
        assert info.value.error_code == 409 and bot.conflicts == 1
    finally:
        await older.close()
        await newer.close()
        bot.stop()


# ----------------------------------------------------------------- the polling lease


async def test_one_of_two_intakes_polls_and_the_other_takes_over_when_its_lease_lapses(
    tmp_path: Path,
):
    """Two servers' intakes on one store (here one ``chats.db``): only the lease holder
    polls; when it stops without a word (its lease is not released), the other polls once
    the lease lapsed, from the offset the first left, and no update is handed out twice."""
    from gateway.surfaces.telegram.intake import LongPoller, SharedIntake

    bot = FakeBotApi().start()
    apis = [TelegramApi(bot.token, base_url=bot.base_url) for _ in range(2)]
    states = [
        TelegramState(
            telegram_backend("sqlite", tmp_path), holder=f"h{i}|b|{i}|{i}", lease_seconds=0.6
        )
        for i in range(2)
    ]
    seen: list[list[int]] = [[], []]

    def answer(i: int, update_id: int) -> None:  # as the adapter does, once answered
        seen[i].append(update_id)
        states[i].mark_answered(apis[i].bot_id, update_id)

    intakes = [
        SharedIntake(
            states[i],
            apis[i].bot_id,
            lambda u, _, i=i: answer(i, u),
            LongPoller(apis[i], states[i], lambda u, _, i=i: answer(i, u), timeout=1),
        )
        for i in range(2)
    ]

    async def until(check) -> None:
        for _ in range(3000):  # 30 s: a takeover on a loaded CI machine can take more than 5
            if check():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("condition not met in time")

    first = asyncio.create_task(intakes[0].run())
    second = None
    try:
        await until(lambda: intakes[0].polling)
        second = asyncio.create_task(intakes[1].run())
        await asyncio.sleep(0.8)  # more than a lease: renewed by the first all along
        assert not intakes[1].polling
        before = bot.message("to the first")
        await until(lambda: seen[0] == [before])
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        await until(lambda: intakes[1].polling)
        after = bot.message("to the second")
        await until(lambda: seen[1] == [after])
        await asyncio.sleep(0.3)
        assert seen == [[before], [after]]
        assert bot.conflicts <= 1  # at most the first's poll cut off by the takeover
    finally:
        for task in (first, second):
            if task is not None and not task.done():
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
        for api in apis:
            await api.close()
        for state in states:
            state.close()
        bot.stop()
