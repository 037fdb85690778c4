"""The project's modules import each other without circles, function-level imports included
(a circle hidden behind an import inside a function is still a circle: the two modules cannot
be understood or tested apart), and ``algorithms/`` and ``tasks/`` never import each other."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("harness", "algorithms", "tasks", "lantern")


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    mods = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            name = ".".join(path.relative_to(root).with_suffix("").parts)
            mods[name.removesuffix(".__init__")] = path
    return mods


def import_graph(root: Path = ROOT) -> nx.DiGraph:
    """module -> each project module it imports, anywhere in its source."""
    mods = project_modules(root)

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = nx.DiGraph()
    graph.add_nodes_from(mods)
    for module, path in mods.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                # `from pkg import submodule` imports the submodule; else the module itself
                targets = [f"{base}.{a.name}" for a in node.names
                           if resolve(f"{base}.{a.name}") == f"{base}.{a.name}"] or [base]
            else:
                continue
            for target in targets:
                found = resolve(target)
                if found is not None and found != module:
                    graph.add_edge(module, found)
    return graph


def circles(graph: nx.DiGraph) -> list[list[str]]:
    return sorted(sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1)


def test_no_module_imports_itself_back_through_others():
    assert circles(import_graph()) == []


def test_algorithms_and_tasks_never_import_each_other():
    graph = import_graph()
    crossing = [(a, b) for a, b in graph.edges
                if {a.split(".")[0], b.split(".")[0]} == {"algorithms", "tasks"}]
    assert crossing == []


def test_the_checker_finds_a_circle_hidden_in_a_function(tmp_path):
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "harness" / "a.py").write_text("from harness.b import g\n")
    (tmp_path / "harness" / "b.py").write_text("def g():\n    from harness import a\n")
    (tmp_path / "harness" / "c.py").write_text("from . import a\n")
    assert circles(import_graph(tmp_path)) == [["harness.a", "harness.b"]]
