"""Every shell example in the README and docs/ pastes into the quick start's terminal: each variable
it uses is one that terminal has (`. ./.env` gives the demo keys and the settings, the README sets
`$API`) or one the page's own examples set before. `$ADMIN_KEY` and `$KEY` once answered 401."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from app.platform import config
from scripts.demo_data import DEMO_KEYS

pytestmark = pytest.mark.pure

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```(?:sh|bash|shell)\n(.*?)^```", re.M | re.S)
_USED = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")
_SET = re.compile(r"(?:^|[;&|(]\s*|\bexport\s+|\bfor\s+)([A-Za-z_][A-Za-z0-9_]*)(?:=|\s+in\b)", re.M)

# What the quick start's terminal has: the shell's own, the settings and keys `. ./.env` reads, $API.
TERMINAL = {"HOME", "PATH", "PWD", "USER", "API"}
TERMINAL |= {f.name.upper() for f in fields(config.Settings)}
TERMINAL |= {variable for _, variable in DEMO_KEYS.values()}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_variable_an_example_uses_is_set(page):
    known, unknown = set(TERMINAL), []
    for block in _BLOCK.findall(page.read_text()):
        code = "\n".join(line.split(" #", 1)[0] for line in block.splitlines())  # not in comments
        known |= set(_SET.findall(code))
        unknown += [name for name in _USED.findall(code) if name not in known and not name.isdigit()]
    assert not unknown, f"{page.relative_to(ROOT)}: examples use variables nothing sets: {sorted(set(unknown))}"


def test_the_check_sees_what_it_is_for():
    assert "NOTIFY_ADMIN_KEY" in TERMINAL and "ADMIN_KEY" not in TERMINAL and "KEY" not in TERMINAL
    assert _USED.findall('-H "Authorization: Bearer $KEY"') == ["KEY"]
    assert _SET.findall('ID=$(curl …)\nfor i in 1 2; do echo "$i"; done') == ["ID", "i"]
