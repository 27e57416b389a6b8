"""One writer per table: every statement that writes a table is in its owner module; the others call
the owner. The tables are read from the schema (every table a migration creates, and the migrator's
own), so a new table without an owner fails here. Statements are read from the source: every string
and f-string of the shipped packages, as the statements are written."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

pytestmark = pytest.mark.pure  # reads the source only (make test-pure)

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHIPPED = ("app", "digest", "tracking", "actors")
ENTRY_POINTS = ("app/web/", "app/cli/", "actors/")

OWNERS = {
    "admin_audit": "app/operations/audit.py",
    "admin_sessions": "app/platform/admin_sessions.py",
    "api_keys": "app/platform/apikeys.py",
    "categories": "app/subscribers/categories.py",
    "digest_events": "digest/events.py",
    "digest_marks": "digest/marks.py",
    "digest_runs": "digest/runs.py",
    "digest_send_now": "digest/immediate.py",
    "email_link_history": "tracking/recorder.py",
    "email_links": "tracking/links.py",
    "email_log": "app/newsletter/rows.py",
    "feed_state": "digest/seen.py",
    "feed_state_all": "digest/seen.py",
    "leases": "app/platform/lease.py",
    "legacy_link_codes": "tracking/legacy.py",
    "mail_budget": "app/subscribers/budget.py",
    "mail_event_counts": "tracking/webhook_apply.py",
    "mail_stop": "app/platform/mail_stop.py",
    "newsletters": "app/newsletter/rows.py",
    "retention_drops": "app/platform/retention.py",
    "schema_migrations": "app/platform/migrate.py",
    "subscribers": "app/subscribers/records.py",
    "suppressions": "app/subscribers/suppressions.py",
    "webhook_events": "tracking/webhook_events.py",
}

# Written only by the triggers their migrations define (and removed with their rows by retention's
# partition drops, a statement on a variable table below): no module writes them.
TRIGGER_WRITTEN = {
    "digest_event_keys": "0520/0523: the (source, producer_id) key of each stored event",
    "webhook_event_keys": "0520/0524: the provider event id of each stored webhook event",
    "feed_entities": "0680: the feed summary, one row per entity and category",
}

# Statements whose table is a variable: each is allowed here by name, and writes none of OWNERS'
# tables outside their owner.
DYNAMIC = {
    "app/platform/retention.py": "the event tables' key tables, per dropped partition",
    "app/subscribers/rekey.py": "canonical_email of subscribers and webhook_events: the backfill of migration 0601",
}

_CREATE = re.compile(r"\bCREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?([a-z_][a-z0-9_]*)\b(?!\s+PARTITION\s+OF)", re.I)


def schema_tables() -> set[str]:
    """Every table the migrations create (partitions aside), and schema_migrations (the migrator's)."""
    sql = "\n".join(p.read_text() for p in sorted((ROOT / "sql" / "migrations").glob("*.sql")))
    tables = {name.lower() for name in _CREATE.findall(sql)}
    migrator = "\n".join(_texts(ROOT / "app" / "platform" / "migrate.py"))
    return tables | {name.lower() for name in _CREATE.findall(migrator)}


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


def writers(tables) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {table: set() for table in tables}
    for module, texts in _modules():
        for table in tables:
            if any(_writes(table).search(text) for text in texts):
                found[table].add(module)
    return found


def test_every_table_of_the_schema_has_an_owner_or_is_written_by_triggers_only():
    tables = schema_tables()
    assert {"subscribers", "digest_runs", "webhook_events", "schema_migrations"} <= tables  # the reading works
    assert sorted(tables - OWNERS.keys() - TRIGGER_WRITTEN.keys()) == [], "tables without an owner"
    assert sorted((OWNERS.keys() | TRIGGER_WRITTEN.keys()) - tables) == [], "owners of tables that do not exist"


def test_each_table_has_one_writer_its_owner():
    assert writers(OWNERS) == {table: {owner} for table, owner in OWNERS.items()}


def test_tables_written_by_triggers_have_no_writer():
    assert writers(TRIGGER_WRITTEN) == {table: set() for table in TRIGGER_WRITTEN}


def test_entry_points_hold_no_write_sql():
    """Routes, pages, commands and actors call the domains and app/operations; no statement of theirs
    writes a table, whether it names one or not."""
    any_write = re.compile(r"\b(INSERT\s+INTO|UPDATE\s+\S+\s+SET|DELETE\s+FROM|TRUNCATE)\b", re.IGNORECASE)
    found = sorted(
        module
        for module, texts in _modules()
        if module.startswith(ENTRY_POINTS) and any(any_write.search(t) for t in texts)
    )
    assert found == []


def test_statements_on_a_variable_table_are_known():
    dynamic = re.compile(r"\b(INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+\{\}", re.IGNORECASE)
    found = {module for module, texts in _modules() if any(dynamic.search(t) for t in texts)}
    assert found <= set(DYNAMIC), sorted(found - set(DYNAMIC))


def test_the_check_sees_a_writer_and_a_table():
    # The scan itself: a statement the way the modules write them is found.
    assert _writes("subscribers").search("UPDATE subscribers SET x = 1")
    assert _writes("digest_runs").search("INSERT INTO digest_runs (subscriber_id)")
    assert not _writes("digest_runs").search("SELECT 1 FROM digest_runs")
    assert _CREATE.findall("CREATE TABLE IF NOT EXISTS a_b (x int); CREATE TABLE c PARTITION OF a_b") == ["a_b"]
