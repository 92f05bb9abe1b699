"""The built documentation site, read as HTML (no browser): what a strict build does not catch.

- no Sphinx role (``:mod:``, ``:class:``, ``:func:`` ...) shows as text: docstrings cross-reference
  with mkdocstrings links (``[x][pflower.a.b.x]``), which the strict build resolves;
- no list is rendered as one paragraph (a Markdown list needs a blank line before it);
- math is marked up for KaTeX (``pymdownx.arithmatex``) and KaTeX is served by the site itself,
  fonts included, so the pages render offline;
- every public package of ``pflower`` has an API page.

The site is built once for the session (the ``docs_site`` fixture of ``conftest.py``).
"""

from __future__ import annotations

import pkgutil
import re
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
ROLE = re.compile(r":(?:mod|class|func|meth|data|attr|obj|exc):`")
LIST_LINE = re.compile(r"\n\s*(?:[-*+]|\d+\.) \S")


def _pages(site: Path) -> Iterator[tuple[str, str]]:
    for page in sorted(site.rglob("*.html")):
        yield page.relative_to(site).as_posix(), page.read_text()


class _Paragraphs(HTMLParser):
    """The text of every ``<p>`` (code spans as a placeholder), with its line breaks."""

    def __init__(self) -> None:
        super().__init__()
        self.open: list[list[str]] = []
        self.code = 0
        self.texts: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "p":
            self.open.append([])
        elif tag in ("code", "pre"):
            self.code += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "p" and self.open:
            self.texts.append("".join(self.open.pop()))
        elif tag in ("code", "pre"):
            self.code -= 1

    def handle_data(self, data: str) -> None:
        if self.open:
            self.open[-1].append("x" if self.code else data)


def list_paragraphs(html: str) -> list[str]:
    """The paragraphs of ``html`` that hold a line starting like a list item."""
    parser = _Paragraphs()
    parser.feed(html)
    return [text for text in parser.texts if LIST_LINE.search(text)]


def test_list_paragraphs_finds_a_list_without_a_blank_line_before_it() -> None:
    assert list_paragraphs("<p>Results:\n- one\n- two</p>") == ["Results:\n- one\n- two"]
    assert list_paragraphs("<p>Steps:\n1. build</p><p>a - b\nc</p>") == ["Steps:\n1. build"]
    assert not list_paragraphs("<p>Results:</p><ul><li>one</li></ul>")
    assert not list_paragraphs("<p>see <code>a\n- b</code></p>")


def test_no_sphinx_role_shows_as_text(docs_site: Path) -> None:
    leaks = {
        uri: len(ROLE.findall(re.sub(r"<[^>]+>", "", html))) for uri, html in _pages(docs_site)
    }
    assert not {uri: n for uri, n in leaks.items() if n}


def test_no_list_renders_as_a_paragraph(docs_site: Path) -> None:
    found = {uri: texts for uri, html in _pages(docs_site) if (texts := list_paragraphs(html))}
    assert not found, "a list without a blank line before it: " + repr(found)[:2000]


def test_math_is_marked_up_and_katex_is_served_by_the_site(docs_site: Path) -> None:
    fliu = (docs_site / "algorithms" / "fliu" / "index.html").read_text()
    assert re.search(r'class="arithmatex">\\\[.*\\tilde θ_k\^t', fliu, re.S)  # Eq. 3, displayed
    assert '<span class="arithmatex">\\(Θ^t\\)</span>' in fliu
    assert not re.search(r"\$\S[^$<]*\$", re.sub(r"<(code|pre)>.*?</\1>", "", fliu, flags=re.S))
    assets = re.findall(r'(?:src|href)="([^"]*katex[^"]*)"', fliu)
    assert any(a.endswith("katex.min.js") for a in assets), assets
    assert any(a.endswith("katex.min.css") for a in assets), assets
    for asset in assets:  # served from the site, not from a CDN
        assert not asset.startswith(("http:", "https:", "//")), asset
        assert (docs_site / "algorithms" / "fliu" / asset.split("?")[0]).resolve().is_file(), asset
    css = docs_site / "javascripts" / "katex" / "katex.min.css"
    fonts = set(re.findall(r"url\((fonts/[^)]+\.woff2)\)", css.read_text()))
    assert fonts and all((css.parent / font).is_file() for font in fonts)


def test_every_public_package_has_an_api_page(docs_site: Path) -> None:
    packages = [m.name for m in pkgutil.iter_modules([str(ROOT / "pflower")])]
    for name in (n for n in packages if not n.startswith("_")):
        page = docs_site / "reference" / "api" / name / "index.html"
        assert page.is_file(), name
        assert f'id="pflower.{name}"' in page.read_text(), name
    for name in ("searchspace", "tuning", "blocks"):
        assert name in packages
