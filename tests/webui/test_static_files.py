"""The browser files as shipped: no inline script, style or handler anywhere (the CSP allows
none), every file index.html and the modules name exists, the vendored libraries carry their
licences, and the package data ships them."""

from __future__ import annotations

import re
import tomllib
from html.parser import HTMLParser
from pathlib import Path

STATIC = Path(__file__).resolve().parents[2] / "api" / "static"
ROOT = STATIC.parents[1]


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.problems: list[str] = []
        self.refs: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = dict(attrs)
        for name, _ in attrs:
            if name.startswith("on") or name == "style":
                self.problems.append(f"<{tag} {name}=...>")
        if tag == "style":
            self.problems.append("<style>")
        if tag == "script":
            if not names.get("src"):
                self.problems.append("<script> without src")
            self._in_script = True
        for key in ("src", "href"):
            value = names.get(key)
            if value and value.startswith("/static/"):
                self.refs.append(value)

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script and data.strip():
            self.problems.append("inline script text")


def test_index_html_has_nothing_inline_and_names_only_existing_files() -> None:
    parser = _Collect()
    parser.feed((STATIC / "index.html").read_text())
    assert parser.problems == []
    assert parser.refs
    for ref in parser.refs:
        assert (STATIC / ref.removeprefix("/static/")).is_file(), ref


def test_modules_import_only_existing_files_and_never_parse_html() -> None:
    for module in STATIC.glob("*.js"):
        text = module.read_text()
        for ref in re.findall(r"""(?:from|import\()\s*["'](/static/[^"']+)["']""", text):
            assert (STATIC / ref.removeprefix("/static/")).is_file(), (module.name, ref)
        # text goes in as text: the only HTML parsing is marked + DOMPurify in markdown.js
        parses_html = r"\.(innerHTML|outerHTML)\s*=|insertAdjacentHTML|document\.write"
        assert not re.search(parses_html, text), module.name
        assert "eval(" not in text and "new Function" not in text, module.name


def test_vendored_libraries_carry_their_licences() -> None:
    vendor = STATIC / "vendor"
    libraries = [p for p in vendor.iterdir() if p.is_dir()]
    assert {p.name for p in libraries} >= {"marked", "dompurify", "highlight"}
    for library in libraries:
        assert any(p.name.startswith("LICENSE") for p in library.iterdir()), library.name


def test_package_data_ships_the_static_files() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = project["tool"]["setuptools"]["package-data"]["api"]
    assert "static/**/*" in patterns and "static/*" in patterns
