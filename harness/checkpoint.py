"""Checkpoints: ``<output_dir>/checkpoints/step_<N>/`` holds the engine's weights (Hugging Face
format, loadable by ``from_pretrained``), optimizer/scheduler/sampler RNG state and
``trainer_state.json``. A checkpoint is written to a temporary directory and renamed, so a kill
during the write never leaves a half checkpoint that looks complete; ``latest`` names the newest.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

KEEP = 2


def save_checkpoint(engine: Any, output_dir: Path, step: int, state: dict[str, Any],
                    keep: int = KEEP) -> Path:
    root = Path(output_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:07d}"
    tmp = root / f".tmp_step_{step:07d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    engine.save(tmp)
    (tmp / "trainer_state.json").write_text(json.dumps(state))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    (root / "latest").write_text(final.name + "\n")
    for old in sorted(root.glob("step_*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(path: Path, key: str = "trainer.resume") -> Path:
    """``path`` may be a checkpoint dir, a ``checkpoints`` dir or a run's output dir; ``key``
    names the config key that gave it, in the error."""
    path = Path(path)
    if (path / "trainer_state.json").exists():
        return path
    for root in (path / "checkpoints", path):
        pointer = root / "latest"
        if pointer.exists():
            candidate = root / pointer.read_text().strip()
            if (candidate / "trainer_state.json").exists():
                return candidate
    raise FileNotFoundError(
        f"{key}={str(path)!r}: no checkpoint there (expected a step_* directory with "
        "trainer_state.json, or an output dir containing checkpoints/latest)"
    )


def prune_checkpoints(output_dir: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints of a finished run (``latest`` is among the
    kept ones); returns the deleted directories."""
    root = Path(output_dir) / "checkpoints"
    doomed = sorted(root.glob("step_*"))[:-keep] if keep > 0 else []
    for old in doomed:
        shutil.rmtree(old, ignore_errors=True)
    return doomed


def seed_everything(seed: int) -> None:
    """Seed the three generators :func:`rng_state` captures."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """The Python, torch and NumPy generators' states as JSON-able lists (the checkpoint holds
    every source of randomness the loop draws from, so a resumed run repeats its metrics)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"python_rng": random.getstate(), "torch_rng": torch.get_rng_state().tolist(),
            "numpy_rng": [kind, keys.tolist(), int(pos), int(has_gauss), float(gauss)]}


def restore_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_tuplify(state["python_rng"]))
    torch.set_rng_state(torch.tensor(state["torch_rng"], dtype=torch.uint8))
    if "numpy_rng" in state:
        kind, keys, pos, has_gauss, gauss = state["numpy_rng"]
        np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))


def _tuplify(obj: Any) -> Any:  # JSON turned random.getstate()'s tuples into lists
    return tuple(_tuplify(x) for x in obj) if isinstance(obj, list) else obj
