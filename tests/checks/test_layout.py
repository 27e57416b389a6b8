"""The layers, checked from the source (AST): imports point down only — platform ← domains ← entry
points — including imports by string (importlib, "module:attribute" targets) and actor names; no
import circles; no imports hidden in functions except the measured ones; nothing from scripts/.

The layers, bottom up (a module may import its own package and anything below it):

  0  app/platform      configuration, database, queue, HTTP, tokens, metrics, migrations, mail, providers
  1  app/subscribers   the people we mail: records, categories, streams, address keys
  2  tracking          codes, links, click/open history, SendGrid events stored and applied
  3  digest            events in, digests out: ingest, plan, claim, build, send, runs
  3  app/newsletter    newsletters: outbox, rows, send loop      (digest and newsletter never import each other)
  4  app/operations    changes that span domains, one function each (erase, opt out, stop/resume, suppressions)
  5  app/web, app/cli, actors   entry points: routes, pages, admin, CLI and scheduler, Dramatiq actors
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.pure  # no database, no Redis (make test-pure)

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("app", "digest", "tracking", "actors")
LAYERS = (  # (module prefix, layer): the longest matching prefix decides
    ("app.platform", 0),
    ("app.subscribers", 1),
    ("tracking", 2),
    ("digest", 3),
    ("app.newsletter", 3),
    ("app.operations", 4),
    ("app.web", 5),
    ("app.cli", 5),
    ("actors", 5),
    ("app", 5),
)
ENTRY_POINTS = 5
# Imported where used, each with its measured import cost written next to it.
LAZY_ALLOWED = {
    ("app/platform/mail.py", "dkim"),
    ("app/platform/observability.py", "sentry_sdk"),
    ("app/platform/observability.py", "sentry_sdk.integrations.dramatiq"),
    ("app/platform/observability.py", "sentry_sdk.integrations.starlette"),
    ("app/platform/css_inline.py", "premailer"),
    ("app/platform/providers/smtp_async.py", "uvloop"),
    ("app/web/admin/charts.py", "matplotlib"),
    ("app/web/admin/charts.py", "matplotlib.figure"),
    ("app/web/admin/charts.py", "matplotlib.dates"),
    ("app/cli/core.py", "uvicorn"),
    ("app/cli/core.py", "app.web"),
}
MODULE_STRING = re.compile(r"^(?:app|digest|tracking|actors)(?:\.[a-z_][a-z0-9_]*)+(?::[A-Za-z_]\w*)?$")


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


MODULES = _modules()


def layer_of(module: str) -> tuple[str, int]:
    prefix, layer = max(
        ((p, n) for p, n in LAYERS if module == p or module.startswith(p + ".")), key=lambda pair: len(pair[0])
    )
    return prefix, layer


def _imports(tree: ast.AST, top_level: bool):
    nodes = (
        tree.body
        if top_level
        else [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    )
    for node in nodes:
        for inner in [node] if top_level else ast.walk(node):
            if isinstance(inner, ast.Import):
                yield from ((a.name, inner) for a in inner.names)
            elif isinstance(inner, ast.ImportFrom) and inner.module and inner.level == 0:
                yield from ((f"{inner.module}.{a.name}", inner) for a in inner.names)


def _project_module(target: str) -> str | None:
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


def _references(path: Path):
    """(module it names, how): every import, at any depth, and every string naming a module."""
    tree = ast.parse(path.read_text())
    for top_level in (True, False):
        for target, _ in _imports(tree, top_level):
            found = _project_module(target)
            if found:
                yield found, f"import {target}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_STRING.match(node.value):
            found = _project_module(node.value.partition(":")[0])
            if found:
                yield found, f"string {node.value!r}"


def _graph() -> dict[str, set[str]]:
    graph = {}
    for name, path in MODULES.items():
        deps = set()
        for target, _ in _imports(ast.parse(path.read_text()), top_level=True):
            found = _project_module(target)
            if found and found != name:
                deps.add(found)
        graph[name] = deps
    return graph


def test_every_module_has_a_layer():
    for name in MODULES:
        assert layer_of(name), name


def test_imports_point_down_only_including_imports_by_string():
    upward = []
    for name, path in MODULES.items():
        package, layer = layer_of(name)
        for target, how in _references(path):
            target_package, target_layer = layer_of(target)
            if target_package == package:
                continue
            if target_layer > layer or (target_layer == layer and layer < ENTRY_POINTS):
                upward.append(f"{name} (layer {layer}) -> {target} (layer {target_layer}): {how}")
    assert not upward, "\n".join(upward)


def _actor_names() -> set[str]:
    names = set()
    for name, path in MODULES.items():
        if not name.startswith("actors"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and any("actor" in ast.unparse(d) for d in node.decorator_list):
                names.add(node.name)
    return names


def test_below_the_entry_points_nothing_names_an_actor():
    """Domains address messages by the names they own (each domain's `messages` targets); the
    actors take their names from there. The platform knows no message at all."""
    actors = _actor_names()
    assert {"build_and_send_digest", "send_batch", "create_outbox", "apply_webhook_events"} <= actors
    named = []
    for name, path in MODULES.items():
        _package, layer = layer_of(name)
        if layer == ENTRY_POINTS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in actors:
                owner = name.rsplit(".", 1)[-1] == "messages" and layer in (2, 3)
                if not owner:
                    named.append(f"{name}: {node.value!r}")
    assert not named, named


def test_no_import_circles():
    graph, state, cycles = _graph(), {}, []

    def visit(node, stack):
        state[node] = "open"
        for dep in graph[node]:
            if state.get(dep) == "open":
                cycles.append(stack[stack.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep, stack + [dep])
        state[node] = "done"

    for node in graph:
        if node not in state:
            visit(node, [node])
    assert not cycles, cycles


def test_nothing_imports_scripts():
    for path in MODULES.values():
        for top_level in (True, False):
            for target, _ in _imports(ast.parse(path.read_text()), top_level):
                assert not target.startswith("scripts"), (path, target)


def test_no_imports_hidden_in_functions_except_the_measured_ones():
    hidden = set()
    for path in MODULES.values():
        rel = str(path.relative_to(ROOT))
        for target, node in _imports(ast.parse(path.read_text()), top_level=False):
            module = node.module if isinstance(node, ast.ImportFrom) else target
            if (rel, module) not in LAZY_ALLOWED:
                hidden.add((rel, module))
    assert not hidden, sorted(hidden)


def _listed_paths(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w/.])((?:app|digest|tracking|actors)/(?:[a-z0-9_]+/)*(?:[a-z0-9_]+\.py)?)", text))


def test_docs_layout_lists_every_module_and_nothing_that_is_not_there():
    text = (ROOT / "docs" / "layout.md").read_text()
    listed = {p for p in _listed_paths(text) if p.endswith(".py")}
    missing = sorted(
        str(p.relative_to(ROOT))
        for p in MODULES.values()
        if p.name not in ("__init__.py", "__main__.py") and str(p.relative_to(ROOT)) not in listed
    )
    assert not missing, f"docs/layout.md does not list {missing}"
    gone = sorted(p for p in _listed_paths(text) if not (ROOT / p).exists())
    assert not gone, f"docs/layout.md lists what is not in the tree: {gone}"


def test_readme_where_things_are_names_every_package_and_only_real_paths():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Where things are", 1)[1].split("\n## ", 1)[0]
    listed = _listed_paths(section)
    gone = sorted(p for p in listed if not (ROOT / p).exists())
    assert not gone, f"README 'Where things are' names what is not in the tree: {gone}"
    packages = {str(p.parent.relative_to(ROOT)) + "/" for p in MODULES.values() if p.name == "__init__.py"}
    sub_packages_listed_in_docs = {
        "app/",
        "app/web/api/",
        "app/web/pages/",
        "app/web/admin/",
        "app/platform/providers/",
    }
    unnamed = sorted(packages - listed - sub_packages_listed_in_docs)
    assert not unnamed, f"README 'Where things are' does not name the packages {unnamed}"


# A path as the tree spells it, not as part of another path (yoyo/scripts/migrate.py is yoyo's).
_REPO_PATH = re.compile(
    r"(?<![\w/.-])((?:app|digest|tracking|actors|scripts|tests|docs|sql)/[A-Za-z0-9_./-]+\.(?:py|md|sql|html|txt|sh))\b"
)


def _text_files() -> list[Path]:
    found = [ROOT / "README.md", ROOT / "BENCHMARKS.md", ROOT / "Makefile", ROOT / "pyproject.toml"]
    found += sorted(ROOT.glob("Procfile*")) + sorted((ROOT / "docs").rglob("*.md"))
    for top in ("app", "digest", "tracking", "actors", "scripts", "tests"):
        found += sorted((ROOT / top).rglob("*.py"))
    return [p for p in found if p.is_file()]


def test_every_path_named_in_code_and_docs_exists():
    """Comments, docstrings and docs that name a file name one that is there: a moved or removed
    module takes its mentions along (`sql/migrations/NNNN_...` placeholders excepted)."""
    stale = []
    for path in _text_files():
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            stale += [
                f"{path.relative_to(ROOT)}:{n}: {p}"
                for p in _REPO_PATH.findall(line)
                if "NNNN" not in p and not (ROOT / p).exists()
            ]
    assert not stale, "paths that are not in the tree:\n" + "\n".join(stale)


TEST_FOLDERS = (
    "platform",
    "subscribers",
    "tracking",
    "digest",
    "newsletter",
    "operations",
    "web",
    "cli",
    "invariants",
    "checks",
    "dev",
    "drills",
    "browser",
)


def test_tests_mirror_the_tree_in_the_folders_docs_testing_lists():
    tests = ROOT / "tests"
    assert sorted(p.name for p in tests.glob("test_*.py")) == [], "test modules belong in a folder"
    folders = {p.parent.relative_to(tests).parts[0] for p in tests.rglob("test_*.py")}
    assert folders == set(TEST_FOLDERS)
    listed = (ROOT / "docs" / "testing.md").read_text()
    assert [f for f in TEST_FOLDERS if f"`tests/{f}/`" not in listed] == []
    assert all((tests / f / "__init__.py").exists() for f in TEST_FOLDERS)


def test_each_module_is_imported_under_one_name():
    """`from digest import runs as digest_runs` everywhere, not `runs` here and `run_rows` there."""
    names: dict[str, dict[str, set[str]]] = {}
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    target = f"{node.module}.{alias.name}"
                    if target in MODULES:
                        names.setdefault(target, {}).setdefault(alias.asname or alias.name, set()).add(name)
    several = {target: sorted(by) for target, by in names.items() if len(by) > 1}
    assert several == {}
