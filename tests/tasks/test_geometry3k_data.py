"""Geometry3K loaders: the bundled 601 test problems, the original Inter-GPS layout (on the 10
shipped examples) and the Hugging Face parquet layout (on a file the test writes), and the full
variant built from each (rendered vs original diagrams, text-only mode, dataset hash)."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from PIL import Image

from harness.mathgrade.grading import GraderConfig
from harness.task import EvalProtocol
from tasks.geometry3k import datasets, render
from tasks.geometry3k.task import FullConfig, Geometry3kTask

EXAMPLES = datasets.DATA_DIR / "intergps_examples"


def _png(color: tuple[int, int, int], size: int = 20) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (size, size), color).save(buf, format="PNG")
    return buf.getvalue()


def _task(**full) -> Geometry3kTask:
    return Geometry3kTask(Geometry3kTask.Config(grader=GraderConfig(workers=1),
                                                full=FullConfig(**full)))


@pytest.fixture(autouse=True, scope="module")
def _cache(tmp_path_factory):
    """One diagram cache for the module: the 601 test diagrams are rendered once."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLBENCH_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


def test_bundled_test_set_has_601_problems_with_ids_2401_to_3001_and_annotations():
    problems = datasets.load_bundled()
    assert len(problems) == 601
    assert [p.id for p in problems] == [str(i) for i in range(2401, 3002)]
    assert all(p.value and p.logic and p.split == "test" for p in problems)
    assert all("<image>" not in p.text and "thinking process" not in p.text for p in problems)
    assert problems[0].text == "Find the area of the figure." and problems[0].value == "60"
    assert problems[0].logic["point_positions"]["B"] == [93.0, 1.0]
    assert all(p.choices is None and p.letter is None and p.image is None for p in problems)


def test_intergps_loader_reads_choices_answer_letter_and_original_diagram(tmp_path):
    flat = datasets.load_intergps(EXAMPLES, "train")  # <root>/<id>/, filtered by data_type
    assert [p.id for p in flat] == [str(i) for i in range(11, 21)]
    first = flat[0]
    assert (first.choices, first.letter, first.value) == (["30", "40", "60", "80"], "D", "80")
    assert first.image is not None and first.image.startswith(b"\x89PNG")
    assert "\\odot X" in first.text
    for p in flat:
        assert p.value == p.choices[datasets.LETTERS.index(p.letter)]
    layout = tmp_path / "geometry3k"  # the original <root>/<split>/<id>/ layout
    for pid in ("11", "15"):
        shutil.copytree(EXAMPLES / pid, layout / "test" / pid)
    nested = datasets.load("intergps", "test", str(layout))
    assert [p.id for p in nested] == ["11", "15"]
    assert nested[1].value == "5 \\sqrt { 3 }" and nested[1].letter == "C"
    with pytest.raises(FileNotFoundError, match="no val problems"):
        datasets.load_intergps(EXAMPLES, "val")


def test_intergps_loader_rejects_an_answer_that_is_not_a_choice_letter(tmp_path):
    bad = tmp_path / "test" / "7"
    shutil.copytree(EXAMPLES / "12", bad)
    (bad / "data.json").write_text((bad / "data.json").read_text().replace('"B"', '"Q"'))
    with pytest.raises(ValueError, match="not a letter"):
        datasets.load_intergps(tmp_path, "test")


def test_parquet_loader_reads_images_problem_answer_and_joins_test_ids(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = {
        "images": [[{"bytes": _png((255, 0, 0)), "path": None}],
                   [{"bytes": _png((0, 0, 255)), "path": None}]],
        # the first is bundled problem 2402 (unique text+answer), the second is not in it
        "problem": ["<image>Circle O has a radius of 13 inches. Radius O B is perpendicular to "
                    "chord C D which is 24 inches long. Find O X.", "<image>Find x."],
        "answer": ["5", "123456"],
    }
    pq.write_table(pa.table(rows), tmp_path / "test-00000-of-00001.parquet")
    problems = datasets.load("parquet", "test", str(tmp_path))
    assert [p.id for p in problems] == ["2402", "test-0001"]
    assert problems[0].text.startswith("Circle O") and problems[0].value == "5"
    assert problems[0].logic is not None and problems[1].logic is None
    assert datasets.open_image(problems[1].image).getpixel((3, 3)) == (0, 0, 255)
    with pytest.raises(FileNotFoundError, match="no train parquet"):
        datasets.load("parquet", "train", str(tmp_path))


def test_bundled_source_has_only_the_test_split_and_user_sources_need_a_path():
    with pytest.raises(ValueError, match="only the test split"):
        datasets.load("bundled", "train")
    with pytest.raises(ValueError, match=r"needs task\.full\.path"):
        datasets.load("intergps", "test")


@pytest.mark.slow
def test_full_variant_renders_the_bundled_test_diagrams_as_rgb_images():
    task = _task()
    (test,) = task.eval_sets()
    assert test.name == "test" and len(test.examples) == 601
    ex = test.examples[0]
    assert ex.id == "geometry3k-2401" and ex.meta["diagram"] == "rendered"
    assert ex.answer == {"value": "60", "choices": None, "letter": None}
    image = ex.images[0]
    assert image.mode == "RGB" and image.size == (336, 336)
    assert image.convert("RGB").getextrema() == ((0, 255), (0, 255), (0, 255))  # ink on white
    assert ex.prompt[0]["role"] == "user" and "Find the area" in ex.prompt[0]["content"]
    # with the bundled data the RL pool is the test set (plumbing only; documented)
    assert [e.id for e in task.train_examples()] == [e.id for e in test.examples]


def test_full_variant_uses_original_diagrams_and_lists_choices(tmp_path):
    for pid in ("11", "12"):
        shutil.copytree(EXAMPLES / pid, tmp_path / "train" / pid)
        shutil.copytree(EXAMPLES / pid, tmp_path / "test" / pid)
    task = _task(source="intergps", path=str(tmp_path), template="plain")
    ex = task.eval_sets()[0].examples[0]
    original = datasets.open_image((EXAMPLES / "11" / "img_diagram.png").read_bytes())
    assert ex.meta["diagram"] == "original" and ex.images[0].tobytes() == original.tobytes()
    assert "Choices:\nA. 30\nB. 40\nC. 60\nD. 80\n" in ex.prompt
    assert ex.prompt.endswith("(for example \\boxed{B}).\n")
    assert len(task.train_examples()) == 2  # the train split, since the source has one


def test_text_mode_gives_problem_text_and_diagram_logic_forms_without_an_image():
    task = _task(mode="text", template="plain")
    ex = task.eval_sets()[0].examples[0]
    assert ex.images is None and ex.meta["diagram"] == "logic_forms"
    assert ex.prompt.startswith("Find the area of the figure.\nThe diagram, as logic forms:\n")
    assert "Equals(LengthOf(Line(A, B)), 13)\n" in ex.prompt
    assert "Perpendicular(Line(B, D), Line(D, C))" in ex.prompt


def test_text_mode_refuses_problems_without_logic_forms(tmp_path):
    shutil.copytree(EXAMPLES / "11", tmp_path / "test" / "11")  # id 11: not a test annotation
    task = _task(source="intergps", path=str(tmp_path), mode="text", train_split="test")
    with pytest.raises(ValueError, match="needs the Inter-GPS logic forms"):
        task.eval_sets()


def test_dataset_hash_covers_the_diagram_images(tmp_path):
    for pid in ("11", "12"):
        shutil.copytree(EXAMPLES / pid, tmp_path / "test" / pid)
    kw = {"source": "intergps", "path": str(tmp_path), "train_split": "test"}
    before = _task(**kw).dataset_hash()
    assert _task(**kw).dataset_hash() == before
    (tmp_path / "test" / "12" / "img_diagram.png").write_bytes(_png((9, 9, 9)))
    assert _task(**kw).dataset_hash() != before


def test_rendered_diagram_cache_keeps_the_dataset_hash_stable():
    kw = {"train_limit": 5, "eval": {"test": EvalProtocol(limit=20)}}
    first = _task(**kw).dataset_hash()
    assert _task(**kw).dataset_hash() == first  # read back from the cache
    assert _task(**kw, render_size=224).dataset_hash() != first


def test_limits_cut_the_problems_before_diagrams_are_made(monkeypatch):
    made = []
    real = render.diagram_png
    monkeypatch.setattr(render, "diagram_png", lambda rec, size: made.append(1) or real(rec, size))
    task = _task(train_limit=8, eval={"test": EvalProtocol(limit=5)})
    assert len(task.eval_sets()[0].examples) == 5 and len(task.train_examples()) == 8
    assert len(made) == 8  # the first 5 train problems are the eval problems, made once
    assert task.train_examples()[0] is task.eval_sets()[0].examples[0]


def test_unknown_source_mode_and_split_name_the_key():
    with pytest.raises(ValueError, match=r"task\.full\.source"):
        _task(source="hub")
    with pytest.raises(ValueError, match=r"task\.full\.mode"):
        _task(mode="audio")
    with pytest.raises(ValueError, match=r"task\.full\.train_split"):
        _task(train_split="dev")
    assert Path(datasets.DATA_DIR / "SOURCE.md").read_text().count("Copied into rlbench") == 1


def test_intergps_annotation_file_gives_logic_forms_to_every_split(tmp_path):
    shutil.copytree(EXAMPLES / "12", tmp_path / "train" / "12")
    (tmp_path / "train" / "12" / "img_diagram.png").unlink()  # no original: render instead
    annot = {"12": {"point_instances": ["A", "B"], "point_positions": {"A": [0, 0], "B": [50, 0]},
                    "line_instances": ["AB"], "circle_instances": [],
                    "diagram_logic_forms": ["Equals(LengthOf(Line(A, B)), x)"]}}
    (tmp_path / "logic_forms").mkdir()
    (tmp_path / "logic_forms" / datasets.ANNOTATION_FILE).write_text(json.dumps(annot))
    (p,) = datasets.load_intergps(tmp_path, "train")
    assert p.logic == annot["12"] and p.image is None
    text = _task(source="intergps", path=str(tmp_path), mode="text", train_split="train",
                 eval={}).train_examples()[0]
    assert "Equals(LengthOf(Line(A, B)), x)" in text.prompt[0]["content"]
    image = _task(source="intergps", path=str(tmp_path), train_split="train",
                  eval={}).train_examples()[0]
    assert image.meta["diagram"] == "rendered" and image.images[0].size == (336, 336)


def test_parquet_choices_with_a_letter_answer_become_a_choice_problem(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table({"images": [[{"bytes": _png((1, 2, 3)), "path": None}]],
                      "problem": ["<image>Find x."], "answer": ["C"],
                      "choices": [["1", "2", "3", "4"]]})
    pq.write_table(table, tmp_path / "validation.parquet")
    (p,) = datasets.load("parquet", "val", str(tmp_path))
    assert (p.id, p.value, p.letter, p.choices) == ("val-0000", "3", "C", ["1", "2", "3", "4"])
