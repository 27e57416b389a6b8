"""One way to the database (docs/database.md): the driver and the ORM are the platform's, and
every other module runs SQL through app/platform/db.py's API (read from the source)."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHIPPED = ("app", "digest", "tracking", "actors")

# Connections owned by one holder for a stream of transactions or a session (docs/database.md).
OWNED_CONNECTIONS = {
    "tracking/recorder.py": "the click-history writer's stream of transactions",
    "app/cli/core.py": "rekey-addresses: the backfill of migration 0601, on the migration URL, as the migrator",
}


def _modules():
    for package in SHIPPED:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text())


def _imported(tree) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_psycopg2_is_imported_by_the_platform_only():
    found = sorted(m for m, tree in _modules() if "psycopg2" in _imported(tree) and not m.startswith("app/platform/"))
    assert found == []


def test_peewee_is_the_pools_alone():
    found = sorted(m for m, tree in _modules() if _imported(tree) & {"peewee", "playhouse"})
    assert found == ["app/platform/db.py"]


def _attribute_uses(tree, name: str) -> bool:
    return any(
        isinstance(node, ast.Attribute)
        and node.attr == name
        and isinstance(node.value, ast.Name)
        and node.value.id == "db"
        for node in ast.walk(tree)
    )


def test_nobody_reaches_past_the_api_to_the_pool():
    found = sorted(m for m, tree in _modules() if _attribute_uses(tree, "database"))
    assert found == []


def test_connections_are_owned_only_where_documented():
    found = {m for m, tree in _modules() if _attribute_uses(tree, "connect_raw") and not m.startswith("app/platform/")}
    assert found == set(OWNED_CONNECTIONS)
