"""Loaders: the public code benchmarks as :class:`Example` s whose ``answer`` is a test spec.

Files are read from ``tasks/code/data`` (copies with ``SOURCE.md``) or from a user directory in
the same public layout (``humaneval.jsonl``, ``mbpp.jsonl``, ``mbpp_sanitized.json``,
``deepcoder_leetcode_test.json``, ``leetcode_prime_test.jsonl``,
``deepcoder_codeforces_test.json``, ``deepcoder_code_contests_test.json``). ``answer`` holds
``kind`` (functional | stdio), ``units`` (test sources or stdin/stdout pairs), ``preamble``
(prepended to the candidate and run by the judge too), ``judge_setup`` (test fixtures the judge
runs before each unit) and, for HumanEval, ``entry_point``, ``prompt_code`` (prepended when a
completion is only a function body) and ``judge_helpers`` (the prompt's code minus the entry
point's ``def``: imports, helper functions such as ``poly``/``encode_cyclic``/``encode_shift``,
constants; run by the judge only, so the tests call the judge's helpers and a candidate that
redefines one changes nothing but its own process). ``meta["reference"]`` is the dataset's
reference solution, when it has one (never shown to the model). ``meta["dropped_units"]`` counts
the problem's asserts that assert nothing (HumanEval's ``assert True``), dropped from ``units``
so that no program earns fractional credit for them; :func:`load` logs the total.
"""

from __future__ import annotations

import ast
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.types import Example
from tasks.code.grading import asserts_nothing, called_names, split_asserts_counted

DATA_DIR = Path(__file__).parent / "data"
log = logging.getLogger("rlbench")

# LeetCode's implicit imports (DeepCoder/rllm and LiveCodeBench use the same list); without
# `from math import *` and `from string import *` 7 DeepCoder references fail (data/SOURCE.md).
LEETCODE_PREAMBLE = (
    "from typing import *\nfrom collections import *\nfrom itertools import *\n"
    "from functools import *\nfrom heapq import *\nfrom bisect import *\nfrom math import *\n"
    "from string import *\nimport math, re, sys, collections, itertools, functools, heapq, "
    "bisect, string\ninf = float('inf')\n"
)

FENCE_NOTE = "Write your solution as Python code in a single ```python code block."


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def prompt_helpers(prompt: str, entry_point: str) -> str:
    """The prompt's code without the entry point's own definition: its imports, helper functions
    and constants (HumanEval/32 ``poly``), which the tests may call; "" when there is none."""
    tree = ast.parse(prompt)
    tree.body = [n for n in tree.body if not (
        isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and n.name == entry_point)]
    return ast.unparse(tree) + "\n" if tree.body else ""


def real_asserts(tests: list[str]) -> tuple[list[str], int]:
    """``tests`` (one assert each) without those that assert nothing, and how many were dropped;
    all of them when none is real (the problem is still graded)."""
    def trivial(test: str) -> bool:
        try:
            body = ast.parse(test).body
        except SyntaxError:
            return False
        return len(body) == 1 and asserts_nothing(body[0])

    real = [t for t in tests if not trivial(t)]
    return (real, len(tests) - len(real)) if real else (list(tests), 0)


def humaneval(directory: Path) -> list[Example]:
    out = []
    for row in _read_jsonl(directory / "humaneval.jsonl"):
        entry = row["entry_point"]
        tests, dropped = split_asserts_counted(row["test"])
        units = [f"{u}\ncheck({entry})\n" for u in tests]
        prompt = ("Complete the following Python function. " + FENCE_NOTE
                  + "\n\n```python\n" + row["prompt"] + "```\n")
        out.append(Example(
            id=row["task_id"], prompt=prompt,
            answer={"kind": "functional", "units": units, "preamble": "",
                    "entry_point": entry, "prompt_code": row["prompt"],
                    "judge_helpers": prompt_helpers(row["prompt"], entry)},
            meta={"dataset": "humaneval", "dropped_units": dropped,
                  "reference": row["prompt"] + row["canonical_solution"]},
        ))
    return out


def _mbpp_prompt(text: str, tests: list[str]) -> str:
    return (f"You are an expert Python programmer, and here is your task: {text} "
            "Your code should pass these tests:\n\n" + "\n".join(tests) + "\n\n" + FENCE_NOTE)


def mbpp(directory: Path, ids: range | None = None) -> list[Example]:
    out = []
    for row in _read_jsonl(directory / "mbpp.jsonl"):
        if ids is not None and row["task_id"] not in ids:
            continue
        setup = [row["test_setup_code"]] if row.get("test_setup_code", "").strip() else []
        units, dropped = real_asserts(row["test_list"])
        out.append(Example(
            id=f"mbpp/{row['task_id']}", prompt=_mbpp_prompt(row["text"], row["test_list"]),
            answer={"kind": "functional", "units": units, "preamble": "",
                    "judge_setup": setup, "entry_points": called_names(row["test_list"])},
            meta={"dataset": "mbpp", "dropped_units": dropped,
                  "reference": row["code"].replace("\r\n", "\n")},
        ))
    return out


def mbpp_sanitized(directory: Path) -> list[Example]:
    out = []
    for row in _read_json(directory / "mbpp_sanitized.json"):
        imports = "".join(f"{line}\n" for line in row.get("test_imports", []))
        units, dropped = real_asserts(row["test_list"])
        out.append(Example(
            id=f"mbpp_sanitized/{row['task_id']}",
            prompt=_mbpp_prompt(row["prompt"], row["test_list"]),
            answer={"kind": "functional", "units": units, "preamble": imports,
                    "entry_points": called_names(row["test_list"])},
            meta={"dataset": "mbpp_sanitized", "dropped_units": dropped,
                  "reference": row["code"]},
        ))
    return out


def leetcode(directory: Path) -> list[Example]:
    """DeepCoder's LeetCode test set: ``check(Solution().method)`` with the import preamble."""
    out = []
    for i, row in enumerate(_read_json(directory / "deepcoder_leetcode_test.json")):
        units, dropped = split_asserts_counted(row["tests"]["functional"])
        out.append(Example(
            id=f"leetcode/{i}", prompt=row["problem"] + "\n\n" + FENCE_NOTE,
            answer={"kind": "functional", "units": units, "preamble": LEETCODE_PREAMBLE},
            meta={"dataset": "leetcode", "dropped_units": dropped,
                  "reference": row["solutions"]},
        ))
    return out


def leetcode_prime(directory: Path) -> list[Example]:
    """PRIME/Eurus LeetCode eval (no reference solutions)."""
    out = []
    for row in _read_jsonl(directory / "leetcode_prime_test.jsonl"):
        units, dropped = split_asserts_counted(row["test"])
        out.append(Example(
            id=f"leetcode_prime/{row['task_id']}", prompt=row["prompt"] + "\n\n" + FENCE_NOTE,
            answer={"kind": "functional", "units": units, "preamble": LEETCODE_PREAMBLE},
            meta={"dataset": "leetcode_prime", "dropped_units": dropped,
                  "difficulty": row["meta"].get("difficulty")},
        ))
    return out


STDIO_NOTE = ("Read the input from standard input and print the answer to standard output. "
              + FENCE_NOTE)


def codeforces(directory: Path) -> list[Example]:
    out = []
    for i, row in enumerate(_read_json(directory / "deepcoder_codeforces_test.json")):
        units = [{"input": t["input"], "output": t["output"]} for t in row["tests"]]
        out.append(Example(id=f"codeforces/{i}", prompt=row["problem"] + "\n\n" + STDIO_NOTE,
                           answer={"kind": "stdio", "units": units, "preamble": ""},
                           meta={"dataset": "codeforces"}))
    return out


def code_contests(directory: Path) -> list[Example]:
    out = []
    for i, row in enumerate(_read_json(directory / "deepcoder_code_contests_test.json")):
        tests = row["tests"]
        units = [{"input": a, "output": b} for a, b in zip(tests["inputs"], tests["outputs"])]
        out.append(Example(id=f"code_contests/{i}", prompt=row["problem"] + "\n\n" + STDIO_NOTE,
                           answer={"kind": "stdio", "units": units, "preamble": ""},
                           meta={"dataset": "code_contests"}))
    return out


LOADERS: dict[str, Callable[[Path], list[Example]]] = {
    "humaneval": humaneval,
    "mbpp": lambda d: mbpp(d),                          # all 974
    "mbpp_test": lambda d: mbpp(d, range(11, 511)),     # the standard 500-problem test split
    "mbpp_train": lambda d: mbpp(d, range(601, 975)),   # the 374-problem train split
    "mbpp_sanitized": mbpp_sanitized,
    "leetcode": leetcode,
    "leetcode_prime": leetcode_prime,
    "codeforces": codeforces,
    "code_contests": code_contests,
}


def load(name: str, directory: str | Path | None = None) -> list[Example]:
    """Examples of dataset ``name`` from ``directory`` (default: the shipped copies)."""
    if name not in LOADERS:
        raise ValueError(f"unknown code dataset {name!r}; valid: {', '.join(LOADERS)}")
    path = Path(directory).expanduser() if directory else DATA_DIR
    try:
        examples = LOADERS[name](path)
    except FileNotFoundError as exc:
        raise FileNotFoundError(
            f"code dataset {name!r}: {exc.filename} not found (task.full.data_dir="
            f"{str(path)!r}; expected the public file names listed in tasks/code/datasets.py)"
        ) from None
    dropped = [int(ex.meta.get("dropped_units", 0)) for ex in examples]
    if any(dropped):
        log.info("%s: dropped %d test units that assert nothing (assert True) from %d problems",
                 name, sum(dropped), sum(d > 0 for d in dropped))
    return examples
