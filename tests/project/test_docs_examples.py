"""The code in docs/adding-a-task.md is a working task, and the design page names no file
outside the repository."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import yaml

from harness.registry import TASKS
from harness.typed_config import build

ROOT = Path(__file__).resolve().parents[2]


def test_the_adding_a_task_example_registers_builds_and_verifies():
    page = (ROOT / "docs" / "adding-a-task.md").read_text()
    code = re.search(r"```python\n(.*?)```", page, re.DOTALL).group(1)
    conf = yaml.safe_load(re.search(r"```yaml\n(.*?)```", page, re.DOTALL).group(1))
    if "reverse" not in TASKS:  # run the page's module as a module (dataclasses need one)
        module = types.ModuleType("docs_adding_a_task")
        sys.modules[module.__name__] = module
        exec(compile(code, "adding-a-task.md", "exec"), module.__dict__)
    task = build(TASKS, conf, "task")
    ex = task.train_examples()[0]
    assert task.verify(ex, ex.answer).correct and not task.verify(ex, "nope").correct
    assert not task.verify(ex, "  ").parsed
    [heldout] = task.eval_sets()
    assert heldout.protocol.k == [1, 4] and task.warmstart_examples()[0] == (ex, ex.answer)


# the design document and the specs the project was built from live outside the repository; a
# clone must explain itself, so nothing in it points there (spelled as patterns, so that this
# file does not cite them either)
OUTSIDE = re.compile(r"\bDESIGN\.md\b|\.\./shared/|\bshared/(specs|seeds|data)/")


def test_docs_and_code_cite_no_design_file_outside_the_repository():
    offenders = []
    for path in [*ROOT.glob("harness/**/*.py"), *ROOT.glob("tasks/**/*.py"),
                 *ROOT.glob("algorithms/**/*.py"), *ROOT.glob("benchmarks/**/*.py"),
                 *ROOT.glob("docs/**/*.md"), *ROOT.glob("leaderboards/**/*.md"),
                 ROOT / "README.md", *ROOT.glob("conf/**/*.yaml")]:
        if OUTSIDE.search(path.read_text(errors="ignore")):
            offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, offenders
