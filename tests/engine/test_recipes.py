"""Recipes for fair comparisons (issue 20): the off-policy trainer recipe, the tiny Countdown
validation split the learning-rate protocol tunes on, and the named sweeps behind the boards."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from harness.cli import compose_config
from harness.compat import check
from harness.config import validate_config
from harness.registry import TASKS
from harness.sweeper import is_compatible_sweeper
from harness.typed_config import build
from tests.helpers import FAST_PRETRAIN, load_benchmark, make_config

ROOT = Path(__file__).resolve().parents[2]
SWEEPS = sorted((ROOT / "conf" / "sweep").glob("*.yaml"))
# many algorithms (or cells) to compose and validate: over ~2 s each on a quiet 2-core machine
SLOW_SWEEPS = {"testbed_offpolicy", "testbed_offpolicy_tuning", "suite", "suite_gpu",
               "testbed_onpolicy", "lpo_lr_tuning", "rollout_testbed"}


def _countdown(*overrides: str):
    return build(TASKS, compose_config(list(overrides)).task, "task")


# -- the validation split -------------------------------------------------------------------------
def test_validation_split_is_disjoint_from_heldout_train_pool_and_warm_start():
    task = _countdown("task.tiny.validation=500", "+task.tiny.eval.validation={n: 2, k: [1]}")
    sets = {s.name: {e.id for e in s.examples} for s in task.eval_sets()}
    train = {e.id for e in task.train_examples()}
    warm = {e.id for e, _ in task.warmstart_examples()}
    assert len(sets["validation"]) == 500 and len(sets["heldout"]) == 500
    assert not sets["validation"] & sets["heldout"]
    assert not sets["validation"] & train and not sets["validation"] & warm
    assert len(train) == 8867 - 500  # the validation problems left the RL train pool


def test_validation_split_leaves_the_warm_start_and_heldout_unchanged():
    plain, split = _countdown(), _countdown("task.tiny.validation=500")
    assert plain.warmstart_examples() == split.warmstart_examples()  # same cached model
    assert [e.id for e in plain.eval_sets()[0].examples] == \
        [e.id for e in split.eval_sets()[0].examples]


def test_validation_eval_set_without_a_split_fails_naming_the_key():
    with pytest.raises(ValueError, match=r"task\.tiny\.validation"):
        _countdown("+task.tiny.eval.validation={n: 2, k: [1]}")
    with pytest.raises(ValueError, match=r"task\.tiny\.validation=9000 must be between 0 and"):
        _countdown("task.tiny.validation=9000").train_examples()


# -- the off-policy recipe ------------------------------------------------------------------------
def test_offpolicy_recipe_takes_several_optimizer_steps_over_whole_groups():
    cfg = compose_config(["trainer=offpolicy"])
    batch = cfg.data.prompts_per_step * cfg.rollout.n
    mini = cfg.trainer.mini_batch_size
    assert 0 < mini < batch and batch % mini == 0 and mini % cfg.rollout.n == 0
    assert not cfg.trainer.shuffle  # shuffling would cut LPO's groups
    default = compose_config([])
    assert default.trainer.mini_batch_size == 0 and default.trainer.epochs == 1


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["default", "offpolicy"])
def test_lpo_rev_gradient_is_parallel_to_grpo_only_on_policy(model_cache, recipe):
    """Proposition 1 in the trainer: at the first optimizer step of a batch (pi_theta = pi_old)
    LPO_rev's gradient is GRPO's up to scale; after an update inside the same batch (the
    off-policy recipe's later mini-batches) it is not."""
    def rewards(r: torch.Tensor) -> torch.Tensor:  # the fast warm start solves nothing yet:
        g = torch.Generator().manual_seed(0)      # give every group of 8 mixed rewards
        mixed = (torch.rand(len(r), generator=g) < 0.4).float().view(-1, 8)
        mixed[:, 0], mixed[:, 1] = 1.0, 0.0
        return mixed.flatten()

    probe = load_benchmark("gradient_directions").probe
    out = probe([*FAST_PRETRAIN, f"model.cache_dir={model_cache}", f"trainer={recipe}",
                 "data.prompts_per_step=16", "backend.threads=1"], steps=1, seed=0,
                algorithms=(("grpo", "grpo"), ("lpo_rev", "lpo_rev")),
                pairs=(("lpo_rev", "grpo"),), rewards=rewards)
    cos = {pos: vals[0] for (pos, q), vals in out.items() if q.startswith("cos")}
    assert all(v[0] > 0 for (_, q), v in out.items() if q.startswith("norm"))
    assert cos[0] > 0.9999
    if recipe == "default":
        assert sorted(cos) == [0]  # one optimizer step per batch
    else:
        assert sorted(cos) == [0, 1]  # 128 samples in mini-batches of 64
        assert cos[1] < 0.99


# -- named sweeps ---------------------------------------------------------------------------------
@pytest.mark.parametrize("path", SWEEPS, ids=[p.stem for p in SWEEPS])
def test_named_sweep_owns_its_experiment_and_tags_its_runs(path):
    """Each named sweep writes to its own experiment and tags every run with its name, so a
    board can print the sweep that reproduces it."""
    node = OmegaConf.load(path)
    assert node.tracking.experiment, f"{path.name} sets no tracking.experiment"
    assert node.tracking.tags["rlbench.sweep"] == path.stem
    params = node.hydra.sweeper.params
    assert "seed" in params


@pytest.mark.parametrize("path", [
    pytest.param(p, id=p.stem, marks=[pytest.mark.slow] if p.stem in SLOW_SWEEPS else [])
    for p in SWEEPS])
def test_named_sweep_cells_compose_and_validate(path):
    params = OmegaConf.load(path).hydra.sweeper.params
    fixed = [f"{k}={str(v).split(',')[0]}" for k, v in params.items() if k != "algorithm"]
    for algorithm in str(params.get("algorithm", "grpo")).split(","):
        cfg = compose_config([f"sweep={path.stem}", f"algorithm={algorithm}", *fixed],
                             return_hydra_config=True)
        if is_compatible_sweeper(cfg.hydra) and not check(cfg.algorithm, cfg.task.name).ok:
            continue  # the suite's sweeper drops this cell (tests/report/test_suite.py)
        validate_config(cfg, hardware=False)  # suite_gpu's cells need a GPU to run, not here
        assert cfg.tracking.tags["rlbench.sweep"] == path.stem


# -- step-size metrics ----------------------------------------------------------------------------
@pytest.mark.parametrize(("clip", "share"), [(1e-9, 1.0), (1e9, 0.0)])
def test_trainer_logs_the_share_of_clipped_optimizer_steps(tmp_path, model_cache, clip, share):
    """``actor/grad_clipped_frac``: the share of a step's optimizer steps whose pre-clip norm
    exceeded ``trainer.optim.grad_clip`` (every one with a tiny threshold, none with a huge one),
    beside the pre-clip norm itself."""
    from harness.trainer import Trainer

    cfg = make_config(tmp_path, model_cache, "trainer.steps=1", "trainer.eval_every=0",
                      "data.prompts_per_step=4", "rollout.n=4", "trainer.mini_batch_size=8",
                      "tracking.enabled=false", f"trainer.optim.grad_clip={clip}")
    tr = Trainer(cfg)
    tr._t_start = 0.0
    tr.setup()
    tr.engine.optimizer_step = lambda: 0.5  # two optimizer steps with pre-clip norm 0.5
    metrics = tr.train_step()
    assert metrics["actor/grad_norm"] == pytest.approx(0.5)
    assert metrics["actor/grad_clipped_frac"] == share
