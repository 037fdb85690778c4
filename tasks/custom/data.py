"""Rows of a user's data set: a jsonl / json / parquet / csv file, or a local Hugging Face
``datasets`` directory.

* ``.jsonl`` (one JSON object a line), ``.json`` (a list of objects), ``.parquet``, ``.csv``;
* a directory written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` (loaded with
  ``datasets.load_from_disk``; a ``DatasetDict`` needs ``split`` unless it has one split);
* any other directory of data files, e.g. a hub data set downloaded beforehand
  (``huggingface-cli download --repo-type dataset ...``), loaded with ``datasets.load_dataset``
  on that directory, offline.

Columns are looked up by name; a dotted name reaches into nested records, so verl's parquet
files work as they are (``reward_model.ground_truth``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.typed_config import ConfigError

FILE_KINDS = (".jsonl", ".json", ".parquet", ".csv")
WHAT_WORKS = ("a .jsonl, .json, .parquet or .csv file, or a directory saved by "
              "datasets' save_to_disk (or holding such files)")


def load_rows(path: str, split: str | None, key: str, split_key: str) -> list[dict[str, Any]]:
    """Every row of ``path`` as a dict; ``key`` / ``split_key`` name the config keys of the path
    and of the split in error messages."""
    p = Path(str(path)).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"{key}={str(path)!r} does not exist; give {WHAT_WORKS}")
    if p.is_file():
        return _read_file(p, key)
    if (p / "dataset_info.json").exists() or (p / "dataset_dict.json").exists() \
            or (p / "state.json").exists():
        from datasets import DatasetDict, load_from_disk

        ds = load_from_disk(str(p))
        if isinstance(ds, DatasetDict):
            ds = _pick_split(ds, split, key, split_key, p)
        return ds.to_list()
    files = [f for f in sorted(p.rglob("*")) if f.suffix in FILE_KINDS and f.is_file()]
    if not files:
        raise FileNotFoundError(f"{key}={str(path)!r} is a directory with no data files; give "
                                f"{WHAT_WORKS}")
    from datasets import DatasetDict, load_dataset

    try:
        ds = load_dataset(str(p))
    except Exception as exc:
        raise ConfigError(
            f"{key}={str(path)!r}: datasets cannot load this directory ({exc})") from None
    if isinstance(ds, DatasetDict):
        ds = _pick_split(ds, split, key, split_key, p)
    return ds.to_list()


def _pick_split(ds: Any, split: str | None, key: str, split_key: str, path: Path) -> Any:
    splits = list(ds.keys())
    if split is None and len(splits) == 1:
        return ds[splits[0]]
    if split not in splits:
        given = f"has no split {split!r}" if split else "has several splits"
        raise ConfigError(f"{key}={str(path)!r} {given}: choose one of {', '.join(splits)} "
                          f"with {split_key}=<name>")
    return ds[split]


def _read_file(p: Path, key: str) -> list[dict[str, Any]]:
    suffix = p.suffix.lower()
    if suffix == ".jsonl":
        rows = []
        with p.open(encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise ConfigError(
                            f"{key}={str(p)!r}: line {n} is not JSON ({exc.msg})") from None
        return rows
    if suffix == ".json":
        data = json.loads(p.read_text(encoding="utf-8"))
        if not isinstance(data, list):
            raise ConfigError(f"{key}={str(p)!r}: a .json file must hold a list of objects "
                              "(one object a line: use .jsonl)")
        return data
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(p).to_pylist()
    if suffix == ".csv":
        import pyarrow.csv as pcsv

        return pcsv.read_csv(p).to_pylist()
    raise ConfigError(f"{key}={str(p)!r}: unknown file type {suffix!r}; give {WHAT_WORKS}")


def column(row: dict[str, Any], name: str, key: str, where: str) -> Any:
    """``row[name]``, a dotted name reaching into nested dicts; a clear error when absent."""
    value: Any = row
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            raise ConfigError(f"{key}={name!r}: no column {name!r} in {where} (columns: "
                              f"{', '.join(map(str, row))}); map yours with {key}=<column>")
        value = value[part]
    return value
