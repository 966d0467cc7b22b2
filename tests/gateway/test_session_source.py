"""SessionSource serialisation/validation and collision-free session keys."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.config import Platform
from gateway.session import SessionSource, build_session_key


def test_platform_values_are_lowercase_names() -> None:
    for member in Platform:
        assert member.value == member.name.lower()
    assert Platform("api_server") is Platform.API_SERVER
    assert f"{Platform.WEBUI}" == "webui"


def test_round_trip_full_and_minimal() -> None:
    full = SessionSource(
        platform=Platform.SLACK,
        chat_id="C123",
        chat_type="channel",
        user_id="U1",
        user_name="ada",
        thread_id="1700000000.000100",
        chat_name="#general",
    )
    assert SessionSource.from_dict(full.to_dict()) == full
    minimal = SessionSource(platform=Platform.LOCAL, chat_id="console")
    assert minimal.chat_type == "dm"
    assert SessionSource.from_dict(minimal.to_dict()) == minimal


def test_to_dict_is_json_plain() -> None:
    d = SessionSource(platform=Platform.TELEGRAM, chat_id="1").to_dict()
    assert d["platform"] == "telegram"
    assert type(d["platform"]) is str


def test_from_dict_defaults_coercions_and_unknown_keys() -> None:
    src = SessionSource.from_dict(
        {"platform": "telegram", "chat_id": -100123, "user_id": 42, "future_field": 1}
    )
    assert src.platform is Platform.TELEGRAM
    assert src.chat_id == "-100123"
    assert src.user_id == "42"
    assert src.chat_type == "dm"


def test_constructor_accepts_platform_string_and_numeric_ids() -> None:
    src = SessionSource(platform="discord", chat_id=7)  # type: ignore[arg-type]
    assert src.platform is Platform.DISCORD
    assert src.chat_id == "7"
    assert src == SessionSource.from_dict(src.to_dict())


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"platform": "myspace", "chat_id": "1"}, "unknown platform 'myspace'"),
        ({"chat_id": "1"}, "unknown platform None"),
        ({"platform": "telegram"}, "missing required field 'chat_id'"),
        ({"platform": "telegram", "chat_id": None}, "missing required field 'chat_id'"),
        ({"platform": "telegram", "chat_id": ""}, "chat_id must not be empty"),
        ({"platform": "telegram", "chat_id": True}, "chat_id must be a string"),
        ({"platform": "telegram", "chat_id": ["x"]}, "chat_id must be a string"),
        ({"platform": "telegram", "chat_id": "1", "chat_type": ""}, "chat_type"),
        ({"platform": "telegram", "chat_id": "1", "user_name": {}}, "user_name"),
    ],
)
def test_from_dict_rejects_invalid(data: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        SessionSource.from_dict(data)


def test_from_dict_rejects_non_mapping() -> None:
    with pytest.raises(ValueError, match="mapping"):
        SessionSource.from_dict(["telegram", "1"])  # type: ignore[arg-type]


def test_constructor_rejects_unknown_platform() -> None:
    with pytest.raises(ValueError, match="unknown platform"):
        SessionSource(platform="nope", chat_id="1")  # type: ignore[arg-type]


def test_session_key_shape() -> None:
    src = SessionSource(platform=Platform.TELEGRAM, chat_id="chat-1", chat_type="group")
    assert build_session_key(src) == "agent:main:telegram:group:chat-1"
    src.thread_id = "99"
    assert build_session_key(src) == "agent:main:telegram:group:chat-1:thread:99"
    assert build_session_key(src, agent="ops") == "agent:ops:telegram:group:chat-1:thread:99"


def test_session_key_is_deterministic_and_ignores_display_fields() -> None:
    a = SessionSource(platform=Platform.MATRIX, chat_id="!room:example.org", user_name="a")
    b = SessionSource(platform=Platform.MATRIX, chat_id="!room:example.org", user_name="b")
    assert build_session_key(a) == build_session_key(b)


def test_colon_in_chat_id_cannot_forge_a_thread_key() -> None:
    # Unescaped, both would be "agent:main:telegram:group:a:thread:b".
    threaded = SessionSource(Platform.TELEGRAM, chat_id="a", chat_type="group", thread_id="b")
    forged = SessionSource(Platform.TELEGRAM, chat_id="a:thread:b", chat_type="group")
    assert build_session_key(threaded) != build_session_key(forged)


def test_escape_character_itself_cannot_collide() -> None:
    a = SessionSource(Platform.SLACK, chat_id="x%3Ay")
    b = SessionSource(Platform.SLACK, chat_id="x:y")
    assert build_session_key(a) != build_session_key(b)


def test_chat_type_and_chat_id_boundary_cannot_collide() -> None:
    a = SessionSource(Platform.SLACK, chat_id="b:c", chat_type="a")
    b = SessionSource(Platform.SLACK, chat_id="c", chat_type="a:b")
    assert build_session_key(a) != build_session_key(b)


def test_empty_agent_rejected() -> None:
    with pytest.raises(ValueError):
        build_session_key(SessionSource(Platform.LOCAL, chat_id="x"), agent="")


_text = st.text(alphabet=st.sampled_from("ab:%3A_"), min_size=1, max_size=8)
_sources = st.builds(
    SessionSource,
    platform=st.sampled_from(list(Platform)),
    chat_id=_text,
    chat_type=_text,
    thread_id=st.none() | _text,
)


def _routing_identity(src: SessionSource) -> tuple:
    return (src.platform, src.chat_type, src.chat_id, src.thread_id or None)


@given(_sources, _sources, _text, _text)
def test_session_key_is_injective(a: SessionSource, b: SessionSource, ag1: str, ag2: str) -> None:
    same_key = build_session_key(a, agent=ag1) == build_session_key(b, agent=ag2)
    same_identity = _routing_identity(a) == _routing_identity(b) and ag1 == ag2
    assert same_key == same_identity


def test_a_source_without_a_chat_id_is_anchored_on_its_user() -> None:
    # One key for every user of a platform would be one shared conversation.
    alice = SessionSource(Platform.TELEGRAM, chat_id="", user_id="1001")
    bob = SessionSource(Platform.TELEGRAM, chat_id="", user_id="1002")
    assert build_session_key(alice) == "agent:main:telegram:dm::user:1001"
    assert build_session_key(alice) != build_session_key(bob)
    assert SessionSource.from_dict(alice.to_dict()) == alice
    with pytest.raises(ValueError, match="chat_id"):
        SessionSource.from_dict({"platform": "telegram", "chat_id": ""})
    with pytest.raises(ValueError, match="neither a chat_id nor a user_id"):
        build_session_key(SessionSource(Platform.TELEGRAM, chat_id=""))


def test_hermes_keywords_split_group_and_thread_sessions_per_user() -> None:
    group = SessionSource(Platform.DISCORD, chat_id="c1", chat_type="group", user_id="u1")
    other = SessionSource(Platform.DISCORD, chat_id="c1", chat_type="group", user_id="u2")
    assert build_session_key(group) == build_session_key(other)  # a chat is one conversation
    assert build_session_key(group, group_sessions_per_user=True) == (
        "agent:main:discord:group:c1:user:u1"
    )
    assert build_session_key(group, group_sessions_per_user=True) != build_session_key(
        other, group_sessions_per_user=True
    )
    threaded = SessionSource(
        Platform.DISCORD, chat_id="c1", chat_type="group", user_id="u1", thread_id="t"
    )
    assert build_session_key(threaded, group_sessions_per_user=True) == (
        "agent:main:discord:group:c1:thread:t"
    )
    assert build_session_key(threaded, thread_sessions_per_user=True) == (
        "agent:main:discord:group:c1:thread:t:user:u1"
    )
    dm = SessionSource(Platform.DISCORD, chat_id="d1", user_id="u1")
    assert build_session_key(dm, group_sessions_per_user=True) == "agent:main:discord:dm:d1"


def test_chat_topic_and_alternate_user_id_round_trip() -> None:
    src = SessionSource(Platform.SIGNAL, chat_id="+15550100", chat_topic="ops", user_id_alt=7)
    assert src.user_id_alt == "7"
    assert SessionSource.from_dict(src.to_dict()) == src


# Any text a chat id may hold: the key's escapes, JSON's escapes, quotes, non-ASCII,
# surrogates' neighbours, control characters.
_any_text = st.text(
    alphabet=st.sampled_from('ab:%3A_"\\/\n\t\x00\x7fé€😀\u2028'), min_size=1, max_size=10
) | st.text(min_size=1, max_size=10)


@given(st.sampled_from(list(Platform)), _any_text)
def test_a_chat_alone_is_keyed_and_stored_as_the_general_path_would(
    platform: Platform, chat_id: str
) -> None:
    """A source that is only a platform and a chat (every API conversation's) takes the
    short paths: its key (``chat_session_key``, cached) and its stored JSON (a template).
    Both give what the general path gives: a user id beside a chat in a direct message does
    not change the key but takes the general path; the JSON is ``json.dumps``'s."""
    from gateway.session import chat_session_key

    plain = SessionSource(platform=platform, chat_id=chat_id)
    general = build_session_key(SessionSource(platform=platform, chat_id=chat_id, user_id="u"))
    assert build_session_key(plain) == general
    assert chat_session_key(platform, chat_id) == general
    assert plain.to_json() == json.dumps(plain.to_dict(), sort_keys=True)
    assert json.loads(plain.to_json())["chat_id"] == chat_id


@given(_sources, st.none() | _any_text, st.none() | _any_text)
def test_any_source_is_stored_as_json_dumps_writes_it(
    source: SessionSource, user_name: str | None, topic: str | None
) -> None:
    source.user_name, source.chat_topic = user_name, topic
    assert source.to_json() == json.dumps(source.to_dict(), sort_keys=True)


def test_a_chat_alone_keeps_the_general_checks() -> None:
    from gateway.session import chat_session_key

    with pytest.raises(ValueError, match="neither a chat_id nor a user_id"):
        chat_session_key(Platform.API_SERVER, "")
    assert chat_session_key("api_server", "a:b%") == "agent:main:api_server:dm:a%3Ab%25"  # type: ignore[arg-type]
    assert build_session_key(SessionSource("webui", "s1")) == "agent:main:webui:dm:s1"
