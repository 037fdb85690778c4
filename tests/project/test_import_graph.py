"""The project's modules import each other without circles, function-level imports included
(a circle hidden behind an import inside a function is still a circle: the two modules cannot
be understood or tested apart), and ``algorithms/`` and ``tasks/`` never import each other."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("harness", "algorithms", "tasks", "lantern")


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    mods = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            name = ".".join(path.relative_to(root).with_suffix("").parts)
            mods[name.removesuffix(".__init__")] = path
    return mods


def absolute_module(node: ast.ImportFrom, package: str) -> str:
    """The module a ``from ... import`` reads, with a relative import resolved in ``package``."""
    base = node.module or ""
    if not node.level:
        return base
    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join([*parts, base] if base else parts)


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
                base = absolute_module(node, package)
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


def _top_level_names(path: Path) -> set[str] | None:
    """What a module defines or imports at its top level (None: it has a __getattr__)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == "__getattr__":
                return None
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.If, ast.Try)):  # names bound under a guard count too
            for sub in ast.walk(node):
                if isinstance(sub, (ast.FunctionDef, ast.ClassDef)):
                    names.add(sub.name)
                elif isinstance(sub, (ast.Import, ast.ImportFrom)):
                    names.update((a.asname or a.name).split(".")[0] for a in sub.names)
                elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                    names.add(sub.id)
    return names


def unresolved_imports(root: Path = ROOT) -> list[str]:
    """``from <project module> import <name>`` (anywhere, functions included) where the module
    does not define ``name`` and no submodule of that name exists: an ImportError waiting for
    the code path that runs it."""
    mods = project_modules(root)
    defined = {m: _top_level_names(p) for m, p in mods.items()}
    bad = []
    for module, path in mods.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            if base not in mods or defined[base] is None:
                continue
            for alias in node.names:
                if alias.name != "*" and alias.name not in defined[base] \
                        and f"{base}.{alias.name}" not in mods:
                    bad.append(f"{module}: from {base} import {alias.name}")
    return sorted(bad)


def test_every_name_imported_from_a_project_module_exists_there():
    assert unresolved_imports() == []


def test_the_checker_finds_an_import_of_a_name_that_moved(tmp_path):
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "harness" / "a.py").write_text("def kept():\n    pass\n")
    (tmp_path / "harness" / "b.py").write_text(
        "from harness.a import kept\n\ndef f():\n    from harness.a import moved\n")
    assert unresolved_imports(tmp_path) == ["harness.b: from harness.a import moved"]


# -- the tests themselves ----------------------------------------------------------------------
def imports_of_test_modules(root: Path = ROOT) -> list[str]:
    """Imports (anywhere, functions included) of a test module or a ``conftest`` by a file under
    ``tests/``: what tests share goes in ``tests/helpers.py`` (plain functions, constants) or
    ``tests/conftest.py`` (fixtures, which pytest hands to every test without an import)."""

    def forbidden(name: str) -> bool:
        leaf = name.rpartition(".")[2]
        return leaf == "conftest" or leaf.startswith("test_")

    bad = []
    for path in sorted((root / "tests").rglob("*.py")):
        where = path.relative_to(root).as_posix()
        package = ".".join(path.relative_to(root).parent.parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = absolute_module(node, package)
                names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            elif (isinstance(node, ast.Call) and node.args
                  and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
                  and getattr(node.func, "attr", getattr(node.func, "id", None))
                  in ("import_module", "__import__")):
                names = [node.args[0].value]
            else:
                continue
            bad += [f"{where}:{node.lineno}: {name}" for name in names if forbidden(name)]
    return sorted(set(bad))


def test_no_test_module_imports_another_test_module_or_conftest():
    assert imports_of_test_modules() == []


def test_the_checker_finds_a_test_module_importing_another(tmp_path):
    (tmp_path / "tests" / "sub").mkdir(parents=True)
    (tmp_path / "tests" / "helpers.py").write_text("X = 1\n")
    (tmp_path / "tests" / "test_a.py").write_text(
        "from tests.helpers import X\nfrom tests.test_b import Y\n")
    (tmp_path / "tests" / "test_b.py").write_text("def f():\n    from tests.conftest import Z\n")
    (tmp_path / "tests" / "sub" / "test_c.py").write_text(
        "from .. import test_a\nfrom . import conftest\n"
        "import importlib\nimportlib.import_module('tests.test_b')\n")
    assert imports_of_test_modules(tmp_path) == [
        "tests/sub/test_c.py:1: tests.test_a", "tests/sub/test_c.py:2: tests.sub.conftest",
        "tests/sub/test_c.py:4: tests.test_b", "tests/test_a.py:2: tests.test_b",
        "tests/test_b.py:2: tests.conftest"]


def private_imports(root: Path = ROOT) -> list[str]:
    """``from project.module import _name`` in another module: a private name used across a
    module boundary (the name belongs in the module's public surface, or the code beside it)."""
    mods = project_modules(root)
    found = []
    for module, path in sorted(mods.items()):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in mods \
                    and node.module != module:
                found += [f"{path.relative_to(root)}:{node.lineno}: {node.module}.{a.name}"
                          for a in node.names if a.name.startswith("_")
                          and not a.name.startswith("__")]
    return found


def test_no_module_imports_a_private_name_of_another():
    assert private_imports() == []


def test_the_checker_finds_a_private_import(tmp_path):
    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "a.py").write_text("def _helper():\n    pass\n")
    (tmp_path / "harness" / "b.py").write_text(
        "def f():\n    from harness.a import _helper\n    return _helper\n")
    assert private_imports(tmp_path) == ["harness/b.py:2: harness.a._helper"]
