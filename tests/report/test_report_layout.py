"""The engine's folder holds the engine: reporting (harness/report/) and the command line sit on
top of it, so no engine module imports either (issue 20, "Layout")."""

from __future__ import annotations

import ast
from pathlib import Path

HARNESS = Path(__file__).resolve().parents[2] / "harness"
# Everything under harness/ is the engine except reporting and the command-line front ends
# (``cli`` may be a module or, once split, a package; ``demo`` and ``eval_cli`` are commands).
NOT_ENGINE = ("report", "cli", "cli.py", "demo.py", "eval_cli.py")
FORBIDDEN = ("harness.report", "harness.cli")


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def engine_modules() -> list[Path]:
    return sorted(p for p in HARNESS.rglob("*.py")
                  if p.relative_to(HARNESS).parts[0] not in NOT_ENGINE)


def test_engine_modules_do_not_import_reporting_or_the_cli():
    offenders = {str(p.relative_to(HARNESS)): sorted(
        n for n in _imports(p) if any(n == f or n.startswith(f + ".") for f in FORBIDDEN))
        for p in engine_modules()}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_layout_check_sees_the_engine_and_catches_an_import(tmp_path):
    """The check above is not vacuous: it reads the trainer, and flags both import forms."""
    names = {str(p.relative_to(HARNESS)) for p in engine_modules()}
    assert {"trainer.py", "algorithm.py", "backends/hf.py"} <= names
    assert not any(n.startswith(("report/", "cli")) for n in names)
    bad = tmp_path / "bad.py"
    bad.write_text("from harness.report.board import build_leaderboards\nimport harness.cli\n")
    assert {"harness.report.board", "harness.cli"} <= _imports(bad)


def test_leaderboard_modules_live_in_the_report_package():
    moved = ("board.py", "board_tables.py", "board_mlflow.py", "plots.py", "stats.py")
    assert not any((HARNESS / name).exists() for name in moved)
    assert {"board.py", "tables.py", "mlflow_log.py", "plots.py", "stats.py"} <= \
        {p.name for p in (HARNESS / "report").glob("*.py")}
