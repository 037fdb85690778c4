"""Loaders of Geometry3K (Inter-GPS) problems in the three layouts rlbench reads.

Every loader returns :class:`Problem` rows with one answer schema: the gold ``value`` (LaTeX,
graded by math-verify), the answer ``choices`` and the gold ``letter`` when the source has them.

* ``bundled`` (default): ``tasks/geometry3k/data`` - the 601 test problems (ids 2401..3001) of
  ``test.jsonl`` (problem text + answer value, no choices, no diagram) joined on id with
  ``test_logic_forms.json`` (Inter-GPS's annotation of every test diagram: points with
  coordinates, lines, circles, and the diagram's facts as logic forms). The diagram is rendered
  from that annotation (:mod:`tasks.geometry3k.render`).
* ``intergps``: the original layout ``<root>/{train,val,test}/<id>/data.json`` +
  ``img_diagram.png`` (``problem_text``, ``choices``, ``answer`` as a letter). A root holding
  ``<id>/data.json`` directly (like ``data/intergps_examples``) is read too, keeping the rows whose
  ``data_type`` is the split asked for. The original diagram is used. Inter-GPS's
  ``diagram_logic_forms_annot.json`` (in the root, ``<root>/logic_forms`` or
  ``<root>/../logic_forms``), when present, gives the annotations of every split (text mode,
  rendering); otherwise only test ids have them (the bundled file).
* ``parquet``: the Hugging Face ``hiyouga/geometry3k`` files (``images``, ``problem``,
  ``answer``), a file or a directory holding ``<split>*.parquet`` (``val`` also matches
  ``validation``); optional ``choices`` with ``letter`` (or a letter ``answer``) columns give
  choice problems. Test rows are matched to their Inter-GPS id by problem text where the bundled
  set has exactly one problem with the same text and answer (so the text-only mode finds their
  logic forms); other rows are ``<split>-<row>``.

Nothing is downloaded; a user-supplied path is only read.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).parent / "data"
SOURCES = ("bundled", "intergps", "parquet")
SPLITS = ("train", "val", "test")
TEST_IDS = range(2401, 3002)  # Inter-GPS split ids: train 0-2100, val 2101-2400, test 2401-3001
LETTERS = "ABCDEFGH"
_PEPO_SUFFIX = "\n\nFirst output the thinking process"
_ID_IN_PATH = re.compile(r"/(\d+)/img_diagram")


@dataclass
class Problem:
    id: str                      # Inter-GPS id ("2401") where known, else "<split>-<row>"
    split: str
    text: str                    # the problem statement
    value: str                   # gold answer value (LaTeX), graded by math-verify
    choices: list[str] | None = None
    letter: str | None = None    # gold choice letter (A-D) when there are choices
    logic: dict[str, Any] | None = None  # Inter-GPS annotation (test_logic_forms.json record)
    image: bytes | None = None   # original diagram file bytes, when the source has them


def _norm(text: str) -> str:
    return " ".join(text.split())


def logic_forms(data_dir: Path | None = None) -> dict[str, dict[str, Any]]:
    """Inter-GPS annotations of the 601 test problems, keyed by id ("2401".."3001")."""
    path = Path(data_dir or DATA_DIR) / "test_logic_forms.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object keyed by problem id")
    return data


def load_bundled(data_dir: Path | None = None) -> list[Problem]:
    """The 601 test problems of ``test.jsonl`` with their annotations, in id order."""
    root = Path(data_dir or DATA_DIR)
    forms = logic_forms(root)
    out = []
    with (root / "test.jsonl").open(encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            row = json.loads(line)
            m = _ID_IN_PATH.search(row["images"][0])
            if m is None:
                raise ValueError(f"test.jsonl: no problem id in image path {row['images'][0]!r}")
            pid = m.group(1)
            content = row["messages"][0]["content"]
            text = content.removeprefix("<image>").split(_PEPO_SUFFIX, 1)[0].strip()
            out.append(Problem(id=pid, split="test", text=text, value=str(row["solution"]).strip(),
                               logic=forms.get(pid)))
    return sorted(out, key=lambda p: int(p.id))


def _split_dirs(root: Path, split: str) -> list[tuple[Path, bool]]:
    """Problem directories of ``split`` and whether their ``data_type`` must be checked."""
    sub = root / split
    if sub.is_dir():
        return [(d, False) for d in sub.iterdir() if (d / "data.json").is_file()]
    return [(d, True) for d in root.iterdir() if (d / "data.json").is_file()]


ANNOTATION_FILE = "diagram_logic_forms_annot.json"


def intergps_annotations(root: Path) -> dict[str, dict[str, Any]]:
    """Inter-GPS's diagram annotations of every split when the layout has them
    (``diagram_logic_forms_annot.json`` in ``root``, ``root/logic_forms`` or
    ``root/../logic_forms``), merged over the bundled test annotations."""
    forms = dict(logic_forms())
    for where in (root, root / "logic_forms", root.parent / "logic_forms"):
        path = where / ANNOTATION_FILE
        if path.is_file():
            data = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(data, dict):
                forms.update({str(k): v for k, v in data.items() if isinstance(v, dict)})
            break
    return forms


def load_intergps(root: str | Path, split: str = "test") -> list[Problem]:
    """Problems of one split of the original Inter-GPS layout, in id order."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"Inter-GPS root {root} is not a directory")
    forms = intergps_annotations(root)
    out = []
    for d, check in _split_dirs(root, split):
        data = json.loads((d / "data.json").read_text(encoding="utf-8"))
        if check and data.get("data_type") != split:
            continue
        choices = [str(c) for c in data.get("choices") or []] or None
        letter = str(data.get("answer", "")).strip().upper() or None
        if choices is None or letter is None or letter not in LETTERS[: len(choices)]:
            raise ValueError(f"{d / 'data.json'}: answer {letter!r} is not a letter of "
                             f"{len(choices or [])} choices")
        pid = str(data.get("id", d.name))
        image = d / "img_diagram.png"
        out.append(Problem(id=pid, split=split, text=str(data["problem_text"]).strip(),
                           value=choices[LETTERS.index(letter)], choices=choices, letter=letter,
                           logic=forms.get(pid),
                           image=image.read_bytes() if image.is_file() else None))
    if not out:
        raise FileNotFoundError(f"no {split} problems under {root} (expected "
                                f"{root}/{split}/<id>/data.json)")
    return sorted(out, key=lambda p: (int(p.id) if p.id.isdigit() else 10**9, p.id))


def _parquet_files(path: Path, split: str) -> list[Path]:
    if path.is_file():
        return [path]
    names = (split, "validation") if split == "val" else (split,)
    files = sorted({f for n in names for pat in (f"{n}*.parquet", f"**/{n}*.parquet",
                                                   f"**/*{n}*.parquet") for f in path.glob(pat)})
    if not files:
        raise FileNotFoundError(f"no {split} parquet file under {path}")
    return files


def _image_bytes(cell: Any) -> bytes | None:
    """The first image of a parquet ``images`` cell (a list of {bytes, path} or of bytes)."""
    if isinstance(cell, (list, tuple)):
        cell = cell[0] if cell else None
    if isinstance(cell, dict):
        cell = cell.get("bytes")
    return bytes(cell) if cell else None


def load_parquet(path: str | Path, split: str = "test") -> list[Problem]:
    """Rows of the Hugging Face ``hiyouga/geometry3k`` parquet files of one split."""
    import pyarrow.parquet as pq  # optional at import time: only this loader needs it

    path = Path(path).expanduser()
    rows: list[dict[str, Any]] = []
    for f in _parquet_files(path, split):
        rows += pq.read_table(f).to_pylist()
    forms = logic_forms() if split == "test" else {}
    by_text: dict[tuple[str, str], str | None] = {}
    for p in load_bundled() if split == "test" else []:  # only (text, answer) pairs seen once
        key = (_norm(p.text), _norm(p.value))
        by_text[key] = None if key in by_text else p.id
    out = []
    for i, row in enumerate(rows):
        text = str(row["problem"]).replace("<image>", "").strip()
        pid = by_text.get((_norm(text), _norm(str(row["answer"])))) or f"{split}-{i:04d}"
        choices = [str(c) for c in row.get("choices") or []] or None
        value, letter = str(row["answer"]).strip(), row.get("letter")
        if choices and not letter and value in LETTERS[: len(choices)]:  # answer is a letter
            letter = value
        if choices and letter in LETTERS[: len(choices)]:
            value = choices[LETTERS.index(letter)]
        else:
            letter = None
        out.append(Problem(id=pid, split=split, text=text, value=value, choices=choices,
                           letter=letter, logic=forms.get(pid),
                           image=_image_bytes(row.get("images"))))
    return out


def load(source: str, split: str, path: str | None = None) -> list[Problem]:
    """Problems of ``split`` from ``source`` (``bundled`` has only ``test``)."""
    if source not in SOURCES:
        raise ValueError(f"task.full.source={source!r} is not valid; valid: {', '.join(SOURCES)}")
    if split not in SPLITS:
        raise ValueError(f"split {split!r} is not valid; valid: {', '.join(SPLITS)}")
    if source == "bundled":
        if split != "test":
            raise ValueError(f"the bundled Geometry3K data has only the test split, not {split!r}"
                             " (task.full.source=intergps|parquet with task.full.path reads the"
                             " others)")
        return load_bundled(Path(path) if path else None)
    if not path:
        raise ValueError(f"task.full.source={source} needs task.full.path")
    return load_intergps(path, split) if source == "intergps" else load_parquet(path, split)


def open_image(data: bytes) -> Any:
    """An RGB PIL image from encoded bytes."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        return im.convert("RGB")
