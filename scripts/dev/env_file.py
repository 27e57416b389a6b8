"""`python -m scripts.dev.env_file NAME...`: write the named variables, as this process sees them, to
the checkout's `.env` (ENV_FILE), so every later command reads the same settings without exporting
anything (app/platform/config.py loads the file; the environment wins over it). `make run` calls it
with the development settings; scripts/demo_data.py adds the demo API keys the same way.
Development only: the file is git-ignored and never shipped."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import dotenv

HEADER = (
    "# Written by `make run` (git-ignored): the development settings every command of this checkout reads\n"
    "# (`.venv/bin/notify …`, the processes). A variable set in the environment wins over this file.\n"
)


def path() -> Path | None:
    """ENV_FILE (default .env); None when it is set empty (the tests: no file read or written)."""
    name = os.environ.get("ENV_FILE", ".env")
    return Path(name) if name else None


def write(values: dict[str, str], target: Path) -> Path:
    """Set each NAME=value in the file (other lines kept), single-quoted: bash's `.`, honcho and
    python-dotenv all read it back unchanged."""
    if not target.exists():
        target.write_text(HEADER)
    for name, value in values.items():
        if "'" in value or "\n" in value:
            raise ValueError(f"{name}: a value with a quote or a line break does not belong in {target}")
        dotenv.set_key(str(target), name, value, quote_mode="always")
    return target


def main(argv: list[str]) -> int:
    values = {name: os.environ[name] for name in argv if os.environ.get(name)}
    target = path()
    if target is None:
        print("ENV_FILE is empty: no file written", file=sys.stderr)
        return 2
    write(values, target)
    print(f"{target}: {', '.join(values)} (read by every command in this directory)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
