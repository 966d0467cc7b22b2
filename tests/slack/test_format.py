"""mrkdwn: what the model writes cannot ping, link or break anything on Slack, and a long
reply is split within the limit without cutting an entity, a link or a code block."""

from __future__ import annotations

from gateway.surfaces.slack.format import escape, split_message, to_mrkdwn
from tests.surfaces.slack_fake import visible


def test_the_three_control_characters_are_escaped_everywhere() -> None:
    assert escape("a & b < c > d") == "a &amp; b &lt; c &gt; d"
    text = to_mrkdwn("<!channel> <@U123> & `<code & more>`\n```\n<!here>\n```")
    assert "<!" not in text and "<@" not in text
    assert "`&lt;code &amp; more&gt;`" in text
    assert "&lt;!here&gt;" in text


def test_markdown_is_spelled_as_mrkdwn() -> None:
    assert to_mrkdwn("**bold** and __bold__") == "*bold* and *bold*"
    assert to_mrkdwn("*it* and _it_") == "_it_ and _it_"
    assert to_mrkdwn("~~gone~~") == "~gone~"
    assert to_mrkdwn("## A heading") == "*A heading*"
    assert to_mrkdwn("```python\nx = 1\n```") == "```\nx = 1\n```"
    assert to_mrkdwn("`**not bold**`") == "`**not bold**`"


def test_only_web_and_mail_links_become_links() -> None:
    assert to_mrkdwn("[docs](https://x.io/?a=1&b=2)") == "<https://x.io/?a=1&amp;b=2|docs>"
    assert to_mrkdwn("[mail](mailto:a@b.c)") == "<mailto:a@b.c|mail>"
    assert to_mrkdwn("[x](javascript:alert(1))") == "x (javascript:alert(1))"
    assert "<" not in to_mrkdwn("[x](https://evil|<!channel>)")
    assert to_mrkdwn("![cat](https://x.io/c.png)") == "<https://x.io/c.png|cat>"


def test_a_long_reply_is_split_within_the_limit_on_safe_boundaries() -> None:
    text = "\n\n".join(f"Part {i}: " + "a & b <c> " * 50 for i in range(30))
    pieces = split_message(text, 1000)
    assert all(len(p) <= 1000 for p in pieces)
    joined = " ".join(visible(p) for p in pieces)
    assert all(f"Part {i}:" in joined for i in range(30))
    # A run with no boundary at all is cut, but never inside an entity.
    for piece in split_message("&" * 3000, 1000):
        assert len(piece) <= 1000 and piece.replace("&amp;", "") == ""


def test_a_code_block_cut_by_a_split_is_closed_and_opened_again() -> None:
    code = "```\n" + "\n".join(f"line {i} <x>" for i in range(400)) + "\n```"
    pieces = split_message(code, 1000)
    assert len(pieces) > 1
    for piece in pieces:
        assert len(piece) <= 1000
        assert piece.startswith("```") and piece.endswith("```")


def test_a_link_is_never_cut() -> None:
    text = "see " + " ".join(f"[link {i}](https://example.com/{i})" for i in range(200))
    for piece in split_message(text, 500):
        assert piece.count("<") == piece.count(">")
