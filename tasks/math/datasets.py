"""Loaders of the MATH-family datasets in their public layouts (``data/SOURCE.md``).

Each loader returns ``[(problem, gold), ...]`` plus per-problem metadata, with the gold answer as
a LaTeX string without ``$`` delimiters (graded later by math-verify):

================  ==========================  ============================================
eval set          file                        gold answer
================  ==========================  ============================================
math500           math500.jsonl               ``answer``
aime24            aime24.jsonl                ``answer``
aime25            aime25.jsonl                ``answer``
amc23             amc23.jsonl                 ``answer`` (a JSON number: 27.0 -> ``27``)
minerva           minerva_math.jsonl          last ``\\boxed{}`` of ``solution``
olympiadbench     olympiadbench.jsonl         ``final_answer`` (a list; ``$`` removed, joined)
gsm8k             gsm8k_test.jsonl            the number after ``####`` (commas removed)
math_train        math_train.json             ``answer`` (the training pool)
================  ==========================  ============================================

Rows without a gold answer cannot be graded and are left out: 2 of the 7,474 MATH train rows
(multiple-choice problems whose ``answer`` is empty), so the RL pool has 7,472 problems. Every
eval set keeps its published size.

The files ship in ``tasks/math/data``; ``task.full.data_dir`` points at another directory with
the same file names (e.g. a copy of ``tasks/math/data`` or a Qwen2.5-Math ``evaluation/data`` layout
flattened to these names). Nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.mathgrade.extract import last_boxed

DATA_DIR = Path(__file__).parent / "data"
FILES = {
    "math500": "math500.jsonl",
    "aime24": "aime24.jsonl",
    "aime25": "aime25.jsonl",
    "amc23": "amc23.jsonl",
    "minerva": "minerva_math.jsonl",
    "olympiadbench": "olympiadbench.jsonl",
    "gsm8k": "gsm8k_test.jsonl",
    "math_train": "math_train.json",
}
# The published sizes (tests/tasks/test_math_data.py checks them).
SIZES = {"math500": 500, "aime24": 30, "aime25": 30, "amc23": 40, "minerva": 272,
         "olympiadbench": 675, "gsm8k": 1319, "math_train": 7472}
EVAL_SETS = tuple(k for k in FILES if k != "math_train")


def _rows(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a JSON list of problems")
        return data
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _number(value: Any) -> str:
    """27.0 -> "27", 2.5 -> "2.5", "142.0" -> "142"."""
    try:
        f = float(value)
    except (TypeError, ValueError):
        return str(value).strip()
    return str(int(f)) if f.is_integer() else str(value).strip()


def _gold(name: str, row: dict[str, Any]) -> str:
    if name == "minerva":
        boxed = last_boxed(row["solution"])
        if boxed is None:
            raise ValueError(f"minerva idx {row.get('idx')}: no \\boxed{{}} in the solution")
        return boxed
    if name == "olympiadbench":
        return ", ".join(a.replace("$", "").strip() for a in row["final_answer"])
    if name == "gsm8k":
        return row["answer"].rsplit("####", 1)[1].strip().replace(",", "")
    if name == "amc23":
        return _number(row["answer"])
    return str(row["answer"]).strip()


def _problem(row: dict[str, Any]) -> str:
    for key in ("problem", "question"):
        if isinstance(row.get(key), str) and row[key].strip():
            return row[key].strip()
    raise ValueError(f"no problem text in a row with keys {sorted(row)}")


_META = ("subject", "level", "type", "difficulty", "subfield", "answer_type", "unique_id", "url")


def load(name: str, data_dir: str | Path | None = None) -> list[dict[str, Any]]:
    """Rows ``{"problem", "gold", "index", "meta"}`` of dataset ``name``."""
    if name not in FILES:
        raise ValueError(f"unknown math dataset {name!r}; valid: {', '.join(FILES)}")
    directory = Path(data_dir).expanduser() if data_dir else DATA_DIR
    path = directory / FILES[name]
    if not path.is_file():
        raise FileNotFoundError(
            f"math dataset {name!r}: {str(path)!r} not found (task.full.data_dir must hold "
            f"{', '.join(FILES.values())})")
    out = []
    for i, row in enumerate(_rows(path)):
        gold = _gold(name, row)
        if not gold:
            continue
        meta = {k: row[k] for k in _META if k in row and row[k] is not None}
        out.append({"problem": _problem(row), "gold": gold, "index": i,
                    "meta": meta})
    return out
