"""`python -m app import-legacy-links FILE.csv`: load click codes issued by a previous system
(tracking/legacy.py says the CSV's columns and what an import does). The exit status is 1 if any
line was bad."""

from __future__ import annotations

import sys

from app.cli import commands
from app.platform import db
from tracking import legacy


def cmd_import_legacy_links(args) -> int:
    """load click codes of a previous system from a CSV (code,url,mail,recipient)"""
    db.init()
    try:
        with open(args.file, newline="", encoding="utf-8-sig") as f:
            report = legacy.import_csv(f)
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for lineno, message in report.errors[:50]:
        print(f"line {lineno}: {message}", file=sys.stderr)
    if len(report.errors) > 50:
        print(f"... and {len(report.errors) - 50} more bad lines", file=sys.stderr)
    print(
        f"{report.lines} lines: {report.imported} imported, {report.already_present} already present, "
        f"{report.conflicts} conflicts, {len(report.errors)} bad, "
        f"{report.unknown_recipients} unknown recipient emails (imported without recipient)"
    )
    return 1 if report.errors else 0


def register(sub) -> None:
    p = commands.add(sub, "import-legacy-links", cmd_import_legacy_links)
    p.add_argument("file", help="CSV file; mail column as newsletter:42 or digest:17")
