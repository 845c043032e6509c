"""The documentation's shape: README.md stays short, and every relative link in it,
in docs/ and in benchmarks/README.md names a file of the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted(ROOT.glob("docs/*.md"))]
README_MAX_LINES = 400
# [text](target) and ![alt](target); the target up to a space, ")" or "#"
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>#]*)")


def _links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code is not linked
    return [t for t in _LINK.findall(text) if t]


def test_readme_is_short():
    num_lines = len((ROOT / "README.md").read_text().splitlines())
    assert num_lines <= README_MAX_LINES, f"README.md has {num_lines} lines"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_name_files_of_the_repository(page):
    for target in _links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # a URL (http:, mailto:): not a file
            continue
        path = (page.parent / target).resolve()
        assert path.is_relative_to(ROOT), f"{page.name}: {target} leaves the repository"
        assert path.exists(), f"{page.name}: {target} does not exist"


def test_no_page_points_outside_the_repository():
    for page in PAGES:
        assert "../shared" not in page.read_text(), f"{page.name} names ../shared"
