"""MATH data: the eval sets load with their published sizes, from the shipped copy and from a
user-supplied directory in the public layout; gold answers are read per each file's schema."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tasks.math import datasets
from tasks.math.task import FullConfig, MathTask

PUBLISHED = {"math500": 500, "aime24": 30, "aime25": 30, "amc23": 40, "minerva": 272,
             "olympiadbench": 675}


def test_eval_sets_load_with_their_published_sizes():
    task = MathTask(MathTask.Config(variant="full"))
    sizes = {es.name: len(es.examples) for es in task.eval_sets()}
    assert {k: sizes[k] for k in PUBLISHED} == PUBLISHED
    assert sizes["gsm8k"] == 1319
    assert len(task.train_examples()) == 7472  # 2 rows without a gold answer left out


def test_every_gold_answer_is_a_nonempty_string_without_math_delimiters():
    for name in datasets.FILES:
        rows = datasets.load(name)
        assert len(rows) == datasets.SIZES[name], name
        for r in rows:
            assert isinstance(r["gold"], str) and r["gold"].strip(), (name, r["index"])
            # math delimiters are stripped; an escaped \$ is a currency sign and stays
            assert not re.search(r"(?<!\\)\$", r["gold"]) or name == "minerva", (name, r["index"])
            assert r["problem"].strip()


def test_gold_answers_follow_each_schema():
    assert datasets.load("amc23")[0]["gold"] == "27"                    # JSON 27.0
    assert datasets.load("gsm8k")[0]["gold"] == "18"                    # "#### 18"
    assert datasets.load("minerva")[0]["gold"] == "1.6"                 # last \boxed of solution
    assert datasets.load("olympiadbench")[13]["gold"] == "69,84"        # "$69$,$84$"
    assert "\\frac" in datasets.load("aime25")[18]["problem"]  # the escape SOURCE.md repaired


def test_train_and_math500_do_not_overlap():
    train = {r["problem"] for r in datasets.load("math_train")}
    assert not train & {r["problem"] for r in datasets.load("math500")}


def test_a_user_supplied_directory_in_the_public_layout_is_read(tmp_path: Path):
    for name in datasets.FILES.values():
        shutil.copy(datasets.DATA_DIR / name, tmp_path / name)
    rows = [{"problem": "1+1?", "answer": "2", "unique_id": "x"}]
    (tmp_path / "math500.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = MathTask(MathTask.Config(variant="full", full=FullConfig(data_dir=str(tmp_path))))
    (m500,) = [es for es in task.eval_sets() if es.name == "math500"]
    assert [e.answer["gold"] for e in m500.examples] == ["2"]


def test_a_missing_directory_names_the_files_it_needs(tmp_path: Path):
    missing = FullConfig(data_dir=str(tmp_path / "nope"))
    task = MathTask(MathTask.Config(variant="full", full=missing))
    with pytest.raises(FileNotFoundError, match=r"math_train\.json"):
        task.train_examples()
