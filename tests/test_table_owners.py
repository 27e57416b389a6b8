"""One owner per table's state: every statement that writes one of these tables is in its owner
module; the others call the owner (read from the source: every string and f-string of the
shipped packages, as the statements are written)."""

from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHIPPED = ("app", "digest", "tracking", "actors")

OWNERS = {
    "subscribers": "app/subscribers/records.py",
    "suppressions": "app/subscribers/suppressions.py",
    "digest_send_now": "digest/immediate.py",
    "digest_runs": "digest/runs.py",
    "newsletters": "app/newsletter/rows.py",
    "email_log": "app/newsletter/rows.py",
    "feed_state": "digest/seen.py",
    "digest_marks": "digest/marks.py",
    "feed_state_all": "digest/seen.py",
}

# Statements whose table is a variable: each is allowed here by name, and writes none of OWNERS'
# tables outside their owner.
DYNAMIC = {
    "app/platform/retention.py": "the event tables' key tables, per dropped partition",
    "app/subscribers/rekey.py": "canonical_email of subscribers and webhook_events: the backfill of migration 0601",
}


def _writes(table: str) -> re.Pattern:
    return re.compile(rf"\b(INSERT\s+INTO|UPDATE|DELETE\s+FROM|TRUNCATE(\s+TABLE)?)\s+{table}\b", re.IGNORECASE)


def _texts(path: pathlib.Path):
    """Every string constant, and every f-string's literal text (its placeholders as {})."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.JoinedStr):
            yield "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value


def _modules():
    for package in SHIPPED:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), list(_texts(path))


def writers() -> dict[str, set[str]]:
    found = {table: set() for table in OWNERS}
    for module, texts in _modules():
        for table in OWNERS:
            if any(_writes(table).search(text) for text in texts):
                found[table].add(module)
    return found


def test_each_table_has_one_writer_its_owner():
    assert writers() == {table: {owner} for table, owner in OWNERS.items()}


def test_statements_on_a_variable_table_are_known():
    dynamic = re.compile(r"\b(INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+\{\}", re.IGNORECASE)
    found = {module for module, texts in _modules() if any(dynamic.search(t) for t in texts)}
    assert found <= set(DYNAMIC), sorted(found - set(DYNAMIC))


def test_the_check_sees_a_writer():
    # The scan itself: a statement the way the modules write them is found.
    assert _writes("subscribers").search("UPDATE subscribers SET x = 1")
    assert _writes("digest_runs").search("INSERT INTO digest_runs (subscriber_id)")
    assert not _writes("digest_runs").search("SELECT 1 FROM digest_runs")
