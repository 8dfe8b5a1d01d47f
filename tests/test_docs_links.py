"""Every relative link and image in README.md, docs/*.md and docs/benchmarks/*.md points at a file that exists, and every
``page.md#anchor`` at a heading of that page (GitHub's anchor rule: lower case, punctuation other
than ``-`` and ``_`` dropped, spaces made ``-``)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
         *sorted((ROOT / "docs" / "benchmarks").glob("*.md"))]

_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^#+\s+(.*?)\s*#*\s*$", re.M)


def _prose(text: str) -> str:
    """The text without fenced code blocks and inline code, where brackets are not links."""
    return _CODE.sub("", _FENCE.sub("", text))


def _anchors(page: Path) -> set[str]:
    heads = _HEADING.findall(_FENCE.sub("", page.read_text()))
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def _links(page: Path) -> list[str]:
    return [m.group(1) for m in _LINK.finditer(_prose(page.read_text()))
            if not re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", m.group(1))]  # http:, mailto: ...


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_and_images_resolve(page):
    broken = []
    for target in _links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_docs_index_names_every_page():
    index = (ROOT / "docs" / "README.md").read_text()
    named = {t.partition("#")[0] for t in _links(ROOT / "docs" / "README.md")}
    docs = ROOT / "docs"
    missing = [str(p.relative_to(docs)) for p in PAGES[1:]
               if p.name != "README.md" and str(p.relative_to(docs)) not in named]
    assert not missing, f"docs/README.md does not say which question {missing} answer"
    assert index.startswith("# ")
