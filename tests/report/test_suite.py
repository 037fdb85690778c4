"""conf/sweep/suite.yaml (issue 21 item 2): every compatible algorithm x every tiny task in the
task's own recipe, 5 seeds, one MLflow experiment; hydra/sweeper=compatible drops exactly the
pairs the matrix marks incompatible."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from harness.cli.hydra_app import compatible_cells, expand_cells
from harness.compat import check
from harness.config import CONF_DIR, compose_config

SUITE = ["sweep=suite"]
TINY_TASKS = {"countdown", "math", "code", "geometry3k", "agentic_qa"}
ALGORITHMS = {p.stem for p in (CONF_DIR / "algorithm").glob("*.yaml")}
RECIPES = sorted(p.stem for p in (CONF_DIR / "recipe").glob("*_tiny.yaml"))
# the algorithm each suite row runs: its conf/algorithm/ file, LOPE with tiny-scale prefixes
ROWS = ALGORITHMS - {"lope"} | {"testbed/lope_short"}


@pytest.fixture(scope="module")
def suite() -> tuple[list[list[str]], dict]:
    configs: dict = {}
    return compatible_cells(expand_cells(SUITE), SUITE, configs), configs


def _value(cell: list[str], key: str) -> str:
    return next(o.partition("=")[2] for o in cell if o.partition("=")[0] == key)


@pytest.mark.slow
def test_suite_is_every_compatible_pair_of_every_algorithm_and_tiny_task(suite):
    cells, configs = suite
    pairs: dict[tuple[str, str], set[str]] = {}
    by_recipe: dict[str, str] = {}
    for cell in cells:
        recipe = _value(cell, "recipe")
        key = tuple(o for o in cell if not o.startswith("seed="))
        by_recipe.setdefault(recipe, str(configs[key].task.name))
        pairs.setdefault((_value(cell, "algorithm"), recipe), set()).add(_value(cell, "seed"))
    assert set(by_recipe.values()) == TINY_TASKS
    assert {a for a, _ in pairs} == ROWS  # every algorithm somewhere
    assert all(seeds == {"0", "1", "2", "3", "4"} for seeds in pairs.values())
    # the matrix: ARPO and AEPO need tools, offered by the agentic task only
    tool_only = {"arpo", "aepo"}
    expected = {(a, r) for a in ROWS for r in by_recipe
                if a not in tool_only or by_recipe[r] == "agentic_qa"}
    assert set(pairs) == expected
    assert len(cells) == 5 * len(expected) == 5 * (14 * 5 + 2)


@pytest.mark.slow
def test_suite_has_no_incompatible_cell_and_one_experiment(suite):
    cells, configs = suite
    assert {tuple(o for o in c if not o.startswith("seed=")) for c in cells} == set(configs)
    assert {str(c.tracking.experiment) for c in configs.values()} == {"suite"}
    assert {str(c.tracking.tags["rlbench.sweep"]) for c in configs.values()} == {"suite"}
    assert all(check(c.algorithm, str(c.task.name)).ok for c in configs.values())


@pytest.mark.parametrize(("recipe", "sweep", "pin"), [
    ("countdown_tiny", "countdown_baselines", ["task=countdown", "model=tiny"]),
    ("math_tiny", "math_tiny", ["task=math_tiny", "model=tiny"]),
    ("code_tiny", "code_tiny", ["task=code", "model=tiny"]),
    ("geometry3k_tiny", "geometry3k_tiny", ["task=geometry3k_tiny", "model=tiny_vlm",
                                            "trainer.optim.lr=3e-5"]),
    ("agentic_tiny", "agentic_testbed", ["task=agentic_qa", "model=tiny",
                                         "trainer.mini_batch_size=16", "trainer.optim.lr=1e-5"]),
])
def test_each_recipe_is_its_tasks_tiny_sweep_in_the_offpolicy_update_regime(recipe, sweep, pin):
    """The suite trains each task as its own tiny sweep does, except the update regime: each
    batch in 4 mini-batches (trainer=offpolicy), and where GRPO did not learn in it, the
    learning rate its tuning seeds chose (recipe comments); only tracking differs besides."""
    mine = OmegaConf.to_container(compose_config([f"recipe={recipe}", "algorithm=grpo"]))
    theirs = OmegaConf.to_container(compose_config([f"sweep={sweep}", "algorithm=grpo",
                                                    "trainer=offpolicy", *pin]))
    mine.pop("tracking"), theirs.pop("tracking")
    assert json.dumps(mine, sort_keys=True) == json.dumps(theirs, sort_keys=True)


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_takes_several_optimizer_steps_of_whole_groups_per_batch(recipe):
    """Clip-based, importance-weighted and listwise losses can differ only when pi_theta moves
    within a batch: several mini-batches, each of whole groups (a group's advantages stay
    together)."""
    cfg = compose_config([f"recipe={recipe}", "algorithm=grpo"])
    batch = cfg.data.prompts_per_step * cfg.rollout.n
    mini = cfg.trainer.mini_batch_size
    assert 0 < mini < batch and batch % mini == 0 and mini % cfg.rollout.n == 0
    assert batch // mini == 4


@pytest.mark.slow
def test_lope_runs_with_prefixes_scaled_to_the_tiny_models(suite):
    """The paper's 100-300-word prefixes are ~1,000 characters before a ~13-character prompt
    for the char-level tiny models; the suite runs 1-3 words (stated on the board's limits)."""
    _, configs = suite
    lope = [c for c in configs.values() if str(c.algorithm.name) == "lope"]
    assert len(lope) == 5
    assert all(c.algorithm.rollout.word_max <= 3 for c in lope)


def test_the_suite_board_states_what_its_recipes_cannot_show():
    from harness.report.config import load_config

    limits = load_config(None).limits["suite"]
    for needle in ("1-3", "mini-batches", "two searches", "learning rate"):
        assert needle in limits, needle


@pytest.mark.slow
def test_compatible_sweeper_launches_only_compatible_cells(tmp_path: Path, monkeypatch):
    """Through Hydra itself (the basic launcher, a stub job): the sweeper drops arpo x countdown."""
    from harness.cli import hydra_app

    ran = tmp_path / "ran.jsonl"

    def job(cfg):
        with ran.open("a") as f:
            f.write(json.dumps([cfg.algorithm.name, cfg.task.name]) + "\n")

    monkeypatch.setattr(hydra_app, "_train_job", job)
    hydra_app.register_schema()
    hydra_app._hydra_main(["hydra/sweeper=compatible", "algorithm=grpo,arpo",
                           "task=countdown,agentic_qa", "seed=0",
                           f"hydra.sweep.dir={tmp_path / 'multirun'}"], [], multirun=True)
    got = sorted(tuple(json.loads(line)) for line in ran.read_text().splitlines())
    assert got == [("arpo", "agentic_qa"), ("grpo", "agentic_qa"), ("grpo", "countdown")]
