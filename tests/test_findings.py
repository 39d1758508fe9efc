"""docs/findings.md is the index of docs/findings/ (issue 48): every topic file is listed there,
starts with its title, and the relative links of the findings and of docs/design.md resolve,
anchors included."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slugs(path: Path) -> set[str]:
    """GitHub's anchors of the headings of a Markdown file (outside code blocks)."""
    out, fence = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and re.match(r"#+ ", line):
            title = line.split(" ", 1)[1].strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def broken_links(path: Path) -> list[str]:
    bad = []
    for url in LINK.findall(path.read_text()):
        if re.match(r"[a-z]+:", url):
            continue
        file, _, anchor = url.partition("#")
        target = (path.parent / file).resolve() if file else path
        if not target.exists():
            bad.append(url)
        elif anchor and target.suffix == ".md" and anchor not in _slugs(target):
            bad.append(url)
    return bad


def test_the_index_lists_every_topic_file_and_stays_short():
    index = (DOCS / "findings.md").read_text()
    topics = sorted((DOCS / "findings").glob("*.md"))
    assert len(topics) >= 10
    for path in topics:
        assert f"](findings/{path.name})" in index, path.name
        assert path.read_text().startswith("# "), path.name
    assert len(index.splitlines()) < 100


def test_the_links_of_the_findings_and_of_the_design_resolve():
    pages = [DOCS / "findings.md", DOCS / "design.md", ROOT / "README.md",
             *sorted((DOCS / "findings").glob("*.md"))]
    assert {p.name: broken_links(p) for p in pages if broken_links(p)} == {}


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "a.md").write_text("# A\n\n## Two words\n")
    page = tmp_path / "b.md"
    page.write_text("[x](a.md#two-words) [y](a.md#three) [z](missing.md)\n")
    assert broken_links(page) == ["a.md#three", "missing.md"]
