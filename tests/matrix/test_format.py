"""Matrix message text: HTML safe by construction, and splitting within the limit."""

from __future__ import annotations

import html
from html.parser import HTMLParser

from gateway.surfaces.matrix.format import split_message, to_html

ALLOWED = {"pre", "code", "strong", "em", "del", "a", "br"}


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.open: list[str] = []
        self.seen: set[str] = set()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.seen.add(tag)
        self.hrefs += [v or "" for k, v in attrs if k == "href"]
        if tag != "br":
            self.open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.open and self.open.pop() == tag, tag


def _check(markdown: str) -> _Tags:
    tags = _Tags()
    tags.feed(to_html(markdown))
    tags.close()
    assert not tags.open  # every tag closed, in order
    assert tags.seen <= ALLOWED
    return tags


def test_model_text_is_escaped_and_only_our_tags_appear() -> None:
    hostile = (
        'Tags <b>bold</b> & <script>alert(1)</script> "<img src=x onerror=y>"\n'
        "*half, **unbalanced, `code <i>` [x](javascript:alert(1)) [ok](https://e.org/?a=1&b=<2>)\n"
        "```python\nfenced <i> & never closed\n"
    )
    tags = _check(hostile)
    out = to_html(hostile)
    assert "<script" not in out and "<img" not in out and "<b>" not in out
    assert "javascript:alert(1)" in html.unescape(out)  # visible text, not a link
    assert tags.hrefs == []  # the https link with a raw < is no safe URL: text too
    assert "fenced &lt;i&gt; &amp; never closed" in out


def test_markdown_that_pairs_up_is_formatted() -> None:
    out = to_html("**bold** *it* ~~gone~~ `x<y` [site](https://example.org)\n```sh\nls\n```")
    assert "<strong>bold</strong>" in out and "<em>it</em>" in out
    assert "<del>gone</del>" in out and "<code>x&lt;y</code>" in out
    assert '<a href="https://example.org">site</a>' in out
    assert '<pre><code class="language-sh">ls</code></pre>' in out


def test_a_long_text_is_split_on_paragraphs_within_the_limit() -> None:
    text = "\n\n".join(f"Paragraph {i}: " + "word " * 60 for i in range(40))
    pieces = split_message(text, 1000)
    assert all(0 < len(p) <= 1000 for p in pieces)
    assert all(p.startswith("Paragraph") for p in pieces)
    assert "".join("".join(pieces).split()) == "".join(text.split())  # nothing lost
    assert split_message("x" * 2500, 1000) == ["x" * 1000, "x" * 1000, "x" * 500]
