"""The model's markdown as Telegram HTML: what it converts, and that nothing a model writes
(hostile, unbalanced or odd markdown) ever makes HTML Telegram would refuse. The fake Bot
API's parser (Telegram's rules) is the judge."""

from __future__ import annotations

import random

import pytest

from gateway.surfaces.telegram.format import split_message, to_html, utf16_len
from tests.telegram.fake_bot_api import parse_html


@pytest.mark.parametrize(
    ("markdown", "expected"),
    [
        ("**bold** and __bold__", "<b>bold</b> and <b>bold</b>"),
        ("*it* and _it_ but snake_case_name", "<i>it</i> and <i>it</i> but snake_case_name"),
        ("~~gone~~", "<s>gone</s>"),
        ("`a < b && c`", "<code>a &lt; b &amp;&amp; c</code>"),
        ("[docs](https://e.com/?a=1&b=2)", '<a href="https://e.com/?a=1&amp;b=2">docs</a>'),
        ("[x](javascript:alert)", "x (javascript:alert)"),
        ("# Title", "<b>Title</b>"),
        ("- one\n* two\n1. three", "\u2022 one\n\u2022 two\n1. three"),
        (
            "```python\nif a < b:\n    pass\n```",
            '<pre><code class="language-python">if a &lt; b:\n    pass</code></pre>',
        ),
        ("```\nno language\n```", "<pre>no language</pre>"),
        ("**bold with `code` inside**", "<b>bold with <code>code</code> inside</b>"),
        ("<b>model html</b> & more", "&lt;b&gt;model html&lt;/b&gt; &amp; more"),
        ("a ** b ** c, 2*3*4, lone ` tick", "a ** b ** c, 2*3*4, lone ` tick"),
        ("```\nunclosed <fence>", "<pre>unclosed &lt;fence&gt;</pre>"),
        ("---", "---"),
    ],
)
def test_markdown_becomes_telegram_html(markdown: str, expected: str) -> None:
    assert to_html(markdown) == expected
    parse_html(expected)  # and Telegram takes it


def test_nothing_a_model_writes_breaks_a_message() -> None:
    pieces = ["*", "**", "_", "__", "`", "```", "~~", "[", "]", "(", ")", "<", ">", "&", "#",
              "- ", "\n", " ", "a", "b", "https://x.y", "javascript:", '"', "&amp;", "<b>",
              "</i>", "```py\n", "\u00e9", "\U0001f600"]  # fmt: skip
    rng = random.Random(21)
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 40)))
        html = to_html(text)
        try:
            parse_html(html)
        except ValueError as exc:
            raise AssertionError(f"{text!r} -> {html!r}: {exc}") from None


def test_a_long_reply_splits_into_pieces_telegram_takes() -> None:
    paragraph = "**Step** `x < y` & [link](https://e.com) " * 40
    text = "\n\n".join([paragraph] * 8) + "\n```\n" + "code line\n" * 600 + "```"
    pieces = split_message(text)
    assert len(pieces) > 2
    for piece in pieces:
        visible = parse_html(to_html(piece))
        assert utf16_len(visible) <= 4096
