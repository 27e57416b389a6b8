"""The rules that keep the service working behind PgBouncer in transaction pooling mode
(app/platform/db.py), checked on every SQL string and driver call in the shipped packages (AST):
nothing may leave state in a database session, because the next transaction may run on another
server connection, and the next client may be handed this one.

  - settings: `SET LOCAL` (or set_config(..., true)) inside the transaction, never a session `SET`
  - locks held across transactions: lease rows (app/platform/lease.py), never session advisory locks
  - no LISTEN, no named prepared statements, no WITH HOLD cursors, no session temp tables
    (a temp table says what happens at commit)

The migrator and retention (app/platform/migrate.py, retention.py) are the exceptions by design:
they work on their own direct connection (MIGRATION_DATABASE_URL), where the migrator holds a
session advisory lock, and both set a session lock_timeout around statements that cannot run in a
transaction block (CREATE INDEX / DETACH PARTITION CONCURRENTLY).

These rules are what the PgBouncer pass of `make test` would otherwise have to catch by running
the path that breaks them; checked here, they hold for every path, exercised or not.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.pure  # no database, no Redis (make test-pure)

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("app", "digest", "tracking", "actors")
# The owners of a direct connection (MIGRATION_DATABASE_URL) whose session is theirs by design.
SESSION_OWNERS = {
    "app/platform/migrate.py": "its advisory lock, and a session lock_timeout around CREATE INDEX CONCURRENTLY",
    "app/platform/retention.py": "a session lock_timeout around DETACH PARTITION CONCURRENTLY (no transaction block)",
}

RULES = [
    (
        re.compile(r"(?:^|;)\s*SET\s+(?!LOCAL\b)(?:SESSION\s+)?\w+\s*(?:=|\bTO\b)", re.I),
        "a session SET (use SET LOCAL)",
    ),
    (re.compile(r"\bpg_(?:try_)?advisory_lock(?:_shared)?\s*\(", re.I), "a session advisory lock (use a lease row)"),
    (re.compile(r"\bset_config\s*\([^)]*,\s*false\s*\)", re.I), "set_config(..., false) is a session setting"),
    (re.compile(r"(?:^|;)\s*(?:UN)?LISTEN\s+[\w\"*]+\s*(?:;|$)", re.I), "LISTEN"),
    (re.compile(r"(?:^|;)\s*PREPARE\s+\w+", re.I), "a named prepared statement"),
    (re.compile(r"\bWITH\s+HOLD\b", re.I), "a WITH HOLD cursor"),
]
TEMP_TABLE = re.compile(r"\bCREATE\s+(?:TEMP|TEMPORARY)\s+TABLE\b", re.I)
ON_COMMIT = re.compile(r"\bON\s+COMMIT\s+(?:DROP|DELETE\s+ROWS)\b", re.I)
# Driver calls that change the session: psycopg2's set_session, and cursors kept past their transaction.
SESSION_CALLS = {"set_session", "set_isolation_level", "set_client_encoding"}


def _sources() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def _strings(tree: ast.AST):
    """(line, text) of every string literal; an f-string's holes read as a blank word (no hole holds
    SQL keywords here)."""
    parts = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    parts |= {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}  # docstrings: prose, never run
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            yield node.lineno, "".join(v.value if isinstance(v, ast.Constant) else " x " for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in parts:
            yield node.lineno, node.value


def session_state(path: Path) -> list[str]:
    """Everything in one module that would leave state in a database session."""
    rel = path.relative_to(ROOT).as_posix()
    tree = ast.parse(path.read_text(), filename=rel)
    found = []
    for line, text in _strings(tree):
        for pattern, what in RULES:
            if pattern.search(text):
                found.append(f"{rel}:{line}: {what}: {text.strip()[:80]!r}")
        if TEMP_TABLE.search(text) and not ON_COMMIT.search(text):
            found.append(f"{rel}:{line}: a temp table without ON COMMIT outlives its transaction")
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in SESSION_CALLS:
                found.append(f"{rel}:{node.lineno}: {node.func.attr}() changes the session")
            if any(k.arg == "withhold" for k in node.keywords):
                found.append(f"{rel}:{node.lineno}: a withhold cursor outlives its transaction")
    return found


def test_no_module_leaves_state_in_a_database_session():
    found = [
        v for path in _sources() if path.relative_to(ROOT).as_posix() not in SESSION_OWNERS for v in session_state(path)
    ]
    assert not found, "\n".join(found)


def test_the_exemptions_are_real():
    """The check finds what the two owners of a direct session do there (an exemption nobody needs goes)."""
    migrator = session_state(ROOT / "app/platform/migrate.py")
    assert any("advisory lock" in v for v in migrator), migrator
    assert all(session_state(ROOT / path) for path in SESSION_OWNERS)


@pytest.mark.parametrize(
    "sql",
    [
        "SET statement_timeout = 5000",
        "SELECT 1; SET search_path TO x",
        "SET SESSION lock_timeout = '1s'",
        "SELECT pg_advisory_lock(42)",
        "SELECT pg_try_advisory_lock(1, 2)",
        "SELECT set_config('x.y', '1', false)",
        "LISTEN jobs",
        "PREPARE claim AS SELECT 1",
        "DECLARE c CURSOR WITH HOLD FOR SELECT 1",
    ],
)
def test_session_state_is_caught(sql):
    assert any(pattern.search(sql) for pattern, _ in RULES), sql


@pytest.mark.parametrize(
    "sql",
    [
        "SET LOCAL statement_timeout = 5000",
        "UPDATE subscribers SET email = %s WHERE id = %s",
        "INSERT INTO t (a) VALUES (1) ON CONFLICT (a) DO UPDATE SET a = excluded.a",
        "SELECT pg_advisory_xact_lock(1, 2)",
        "SELECT set_config('x.y', '1', true)",
        "NOTIFY jobs",
    ],
)
def test_transaction_scoped_sql_is_allowed(sql):
    assert not any(pattern.search(sql) for pattern, _ in RULES), sql


def test_temp_tables_must_say_what_happens_at_commit():
    assert TEMP_TABLE.search("CREATE TEMP TABLE s (a int)") and not ON_COMMIT.search("CREATE TEMP TABLE s (a int)")
    ok = "CREATE TEMP TABLE IF NOT EXISTS s (a int) ON COMMIT DELETE ROWS"
    assert TEMP_TABLE.search(ok) and ON_COMMIT.search(ok)
