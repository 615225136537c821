"""The layout holds: the import contracts cover every module of the provider core, no
module imports one that imports it back (across all three packages, not only between
siblings), and no function-level import of the project's own modules hides a cycle."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("openworker", "sessions", "providers")

# Function-level imports with a reason other than a cycle: Django's documented way to
# connect signal receivers once the app registry is ready.
ALLOWED_LOCAL_IMPORTS = {
    ("sessions/apps.py", "sessions"),
    ("providers/edge/apps.py", "providers.edge"),
}


def _contracts() -> list[dict]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    return config["tool"]["importlinter"]["contracts"]


def test_every_provider_core_module_is_held_to_the_no_django_contract():
    contract = next(c for c in _contracts() if c["name"].startswith("The provider core"))
    listed = set(contract["source_modules"])
    core = {
        f"providers.{path.stem if path.is_file() else path.name}"
        for path in (REPO / "providers").iterdir()
        if path.name not in {"__init__.py", "__pycache__", "edge", "cache"}
        and (path.suffix == ".py" or (path / "__init__.py").exists())
    }
    assert core - listed == set(), "add the new core module to the import-linter contract"


def test_no_module_imports_one_that_imports_it_back():
    graph = grimp.build_graph(*ROOTS)
    cycles = []
    for importer in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(importer):
            if imported.split(".")[0] not in ROOTS or imported == importer:
                continue
            if importer.startswith(imported + ".") or imported.startswith(importer + "."):
                continue  # a package and its own modules (`__init__` re-exports)
            chain = graph.find_shortest_chain(importer=imported, imported=importer)
            if chain:
                cycles.append(" -> ".join((importer, *chain[1:])))
    assert cycles == []


def test_no_function_level_import_of_the_projects_own_modules():
    found = []
    for root in ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                for inner in ast.walk(node):
                    if isinstance(inner, ast.ImportFrom) and inner.level == 0 and inner.module:
                        names = [inner.module]
                    elif isinstance(inner, ast.Import):
                        names = [alias.name for alias in inner.names]
                    else:
                        continue
                    for name in names:
                        relative = str(path.relative_to(REPO))
                        if name.split(".")[0] in ROOTS and (relative, name) not in (
                            ALLOWED_LOCAL_IMPORTS
                        ):
                            found.append(f"{relative}:{inner.lineno} imports {name}")
    assert found == []
