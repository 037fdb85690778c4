"""Checkpoint files on disk (harness/checkpoint.py): the step directory's name and contents, the
``latest`` pointer, how many are kept, where a resume path may point, and the random-number state
a resumed run restores."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from harness import checkpoint as ck


class FakeEngine:
    def __init__(self):
        self.saved: list[Path] = []

    def save(self, path: Path) -> None:
        self.saved.append(Path(path))
        (Path(path) / "model.safetensors").write_text("weights")


def test_a_checkpoint_is_a_step_directory_with_weights_and_trainer_state(tmp_path):
    engine = FakeEngine()
    final = ck.save_checkpoint(engine, tmp_path, 12, {"step": 12, "x": [1, 2]})
    assert final == tmp_path / "checkpoints" / "step_0000012"
    assert json.loads((final / "trainer_state.json").read_text()) == {"step": 12, "x": [1, 2]}
    assert (final / "model.safetensors").read_text() == "weights"
    # the engine wrote into the temporary directory that was then renamed
    assert engine.saved == [tmp_path / "checkpoints" / ".tmp_step_0000012"]
    assert not (tmp_path / "checkpoints" / ".tmp_step_0000012").exists()
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step_0000012\n"


def test_a_checkpoint_creates_missing_parent_directories(tmp_path):
    final = ck.save_checkpoint(FakeEngine(), tmp_path / "runs" / "a" / "b", 1, {"step": 1})
    assert final.is_dir()


def test_a_stray_file_among_the_step_directories_does_not_stop_saving_or_pruning(tmp_path):
    root = tmp_path / "checkpoints"
    root.mkdir()
    (root / "step_0000000").write_text("not a directory")
    ck.save_checkpoint(FakeEngine(), tmp_path, 1, {"step": 1}, keep=1)
    ck.save_checkpoint(FakeEngine(), tmp_path, 2, {"step": 2}, keep=5)
    assert ck.prune_checkpoints(tmp_path, keep=1)[0] == root / "step_0000000"


def test_saving_over_a_leftover_temporary_and_an_existing_step_replaces_both(tmp_path):
    root = tmp_path / "checkpoints"
    (root / ".tmp_step_0000003").mkdir(parents=True)
    (root / ".tmp_step_0000003" / "half").write_text("partial")
    (root / "step_0000003").mkdir()
    (root / "step_0000003" / "stale").write_text("old")
    final = ck.save_checkpoint(FakeEngine(), tmp_path, 3, {"step": 3})
    assert sorted(p.name for p in final.iterdir()) == ["model.safetensors", "trainer_state.json"]


def test_only_the_newest_checkpoints_are_kept(tmp_path):
    for step in (1, 2, 3, 10):
        ck.save_checkpoint(FakeEngine(), tmp_path, step, {"step": step})
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.glob("step_*")) == ["step_0000003", "step_0000010"]
    assert ck.KEEP == 2
    ck.save_checkpoint(FakeEngine(), tmp_path, 11, {"step": 11}, keep=1)
    assert sorted(p.name for p in root.glob("step_*")) == ["step_0000011"]


def test_latest_checkpoint_accepts_a_step_dir_a_checkpoints_dir_or_an_output_dir(tmp_path):
    final = ck.save_checkpoint(FakeEngine(), tmp_path, 5, {"step": 5})
    assert ck.latest_checkpoint(final) == final
    assert ck.latest_checkpoint(tmp_path / "checkpoints") == final
    assert ck.latest_checkpoint(tmp_path) == final
    assert ck.latest_checkpoint(str(tmp_path)) == final


def test_latest_checkpoint_ignores_a_pointer_to_an_incomplete_directory(tmp_path):
    root = tmp_path / "checkpoints"
    (root / "step_0000004").mkdir(parents=True)
    (root / "latest").write_text("step_0000004\n")
    with pytest.raises(FileNotFoundError, match="no checkpoint there"):
        ck.latest_checkpoint(tmp_path)


def test_a_missing_checkpoint_names_the_config_key_and_the_path(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        ck.latest_checkpoint(tmp_path / "nowhere", key="eval.checkpoint")
    assert str(err.value) == (
        f"eval.checkpoint={str(tmp_path / 'nowhere')!r}: no checkpoint there (expected a step_* "
        "directory with trainer_state.json, or an output dir containing checkpoints/latest)")
    with pytest.raises(FileNotFoundError, match=r"^trainer\.resume="):
        ck.latest_checkpoint(tmp_path)


def test_prune_keeps_the_newest_and_returns_what_it_deleted(tmp_path):
    for step in (1, 2, 3):
        ck.save_checkpoint(FakeEngine(), tmp_path, step, {"step": step}, keep=10)
    root = tmp_path / "checkpoints"
    doomed = ck.prune_checkpoints(tmp_path, keep=1)
    assert doomed == [root / "step_0000001", root / "step_0000002"]
    assert [p.name for p in root.glob("step_*")] == ["step_0000003"]
    assert ck.prune_checkpoints(tmp_path, keep=0) == []
    assert ck.prune_checkpoints(tmp_path, keep=-1) == []
    assert [p.name for p in root.glob("step_*")] == ["step_0000003"]


def _draws():
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def test_seed_everything_seeds_python_numpy_and_torch():
    ck.seed_everything(7)
    a = _draws()
    ck.seed_everything(7)
    assert _draws() == a
    ck.seed_everything(8)
    assert _draws() != a


def test_rng_state_survives_a_json_round_trip_and_repeats_the_draws():
    ck.seed_everything(3)
    np.random.randn()  # leaves a cached gaussian in NumPy's state
    state = json.loads(json.dumps(ck.rng_state()))
    expected = (_draws(), float(np.random.randn()))
    _draws()
    ck.restore_rng_state(state)
    assert (_draws(), float(np.random.randn())) == expected


def test_restoring_an_old_state_without_numpy_leaves_numpy_alone():
    ck.seed_everything(1)
    state = json.loads(json.dumps(ck.rng_state()))
    del state["numpy_rng"]
    np.random.seed(99)
    expected = float(np.random.rand())
    np.random.seed(99)
    ck.restore_rng_state(state)
    assert float(np.random.rand()) == expected
