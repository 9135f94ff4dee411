"""The README stays short and every relative link of the README and docs/ leads to a file (and heading) that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
MAX_README = 10_000


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {slug(m) for m in re.findall(r"^#+\s+(.+)$", text, flags=re.M)}


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code blocks hold no links
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


def test_readme_is_at_most_ten_thousand_characters() -> None:
    assert len(README.read_text()) <= MAX_README


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.is_file():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(target)
    assert not broken, f"{page.name}: {broken}"


def test_readme_links_every_doc_and_shows_a_picture_from_docs() -> None:
    targets = {t.partition("#")[0] for t in links(README)}
    docs = {f"docs/{p.name}" for p in PAGES[1:]}
    assert docs <= targets
    assert any(t.endswith(".png") and (ROOT / t).is_file() for t in targets)


def test_readme_says_how_to_run_read_and_replay_an_investigation() -> None:
    text = README.read_text()
    for needed in ("make demo", "sleuth investigate --class", "sleuth replay", "sleuth report", "confirmed finding",
                   "6.6 GB", "--reveal"):
        assert needed in text, needed
