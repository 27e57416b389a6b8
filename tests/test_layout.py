"""The layout's rules, checked: imports point one way (platform ← domains ← entry points), no
import circles, no imports hidden in functions except the measured ones, nothing from scripts/."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.pure  # no database, no Redis (make test-pure)

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("app", "digest", "tracking", "actors")
# Imported where used, each with its measured import cost written next to it.
LAZY_ALLOWED = {("app/mail.py", "dkim"), ("app/observability.py", "sentry_sdk"),
                ("app/observability.py", "sentry_sdk.integrations.dramatiq"),
                ("app/observability.py", "sentry_sdk.integrations.starlette"),
                ("app/newsletter/template.py", "premailer"), ("digest/render.py", "premailer"),
                ("app/providers/smtp_async.py", "uvloop"),
                ("app/admin/charts.py", "matplotlib"), ("app/admin/charts.py", "matplotlib.figure"),
                ("app/admin/charts.py", "matplotlib.dates"),
                ("app/cli_core.py", "uvicorn"), ("app/cli_core.py", "app")}


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def _imports(tree: ast.AST, top_level: bool):
    nodes = tree.body if top_level else [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef,
                                                                                      ast.AsyncFunctionDef))]
    for node in nodes:
        for inner in ([node] if top_level else ast.walk(node)):
            if isinstance(inner, ast.Import):
                yield from ((a.name, inner) for a in inner.names)
            elif isinstance(inner, ast.ImportFrom) and inner.module and inner.level == 0:
                yield from ((f"{inner.module}.{a.name}", inner) for a in inner.names)


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        deps = set()
        for target, _ in _imports(ast.parse(path.read_text()), top_level=True):
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                deps.add(target)
        graph[name] = deps
    return graph


def test_no_import_circles():
    graph, state, cycles = _graph(), {}, []

    def visit(node, stack):
        state[node] = "open"
        for dep in graph[node]:
            if state.get(dep) == "open":
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, stack + [dep])
        state[node] = "done"

    for node in graph:
        if node not in state:
            visit(node, [node])
    assert not cycles, cycles


def test_domains_and_platform_never_import_the_actors_or_scripts():
    for name, deps in _graph().items():
        if not name.startswith("actors"):
            assert not any(d.startswith("actors") for d in deps), (name, deps)
    for path in _modules().values():
        for target, _ in _imports(ast.parse(path.read_text()), top_level=True):
            assert not target.startswith("scripts"), (path, target)


def test_no_imports_hidden_in_functions_except_the_measured_ones():
    hidden = set()
    for path in _modules().values():
        rel = str(path.relative_to(ROOT))
        for target, node in _imports(ast.parse(path.read_text()), top_level=False):
            module = node.module if isinstance(node, ast.ImportFrom) else target
            if (rel, module) not in LAZY_ALLOWED:
                hidden.add((rel, module))
    assert not hidden, sorted(hidden)
