"""Checkpoints: ``<output_dir>/checkpoints/step_<N>/`` holds the engine's weights (Hugging Face
format, loadable by ``from_pretrained``), optimizer/scheduler/sampler RNG state and
``trainer_state.json``. A checkpoint is written to a temporary directory and renamed, so a kill
during the write never leaves a half checkpoint that looks complete; ``latest`` names the newest.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

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
