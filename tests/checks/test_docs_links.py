"""The README and the docs/ pages link each other by relative paths: every such link resolves (the
pages moved out of the README once; a rename must not leave a link behind)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.pure

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in _LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        if not (page.parent / target.split("#", 1)[0]).exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)} links to what is not there: {broken}"


def test_readme_contents_lists_every_docs_page():
    readme = (ROOT / "README.md").read_text()
    contents = readme.split("\n## Contents\n", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"\]\((docs/[^)]+\.md)\)", contents))
    pages = {str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")}
    assert pages == listed, {"not in Contents": pages - listed, "not a page": listed - pages}
