"""conf/sweep/suite_gpu.yaml (issue 35 item 5): the suite's cross-product on real models and the
full tasks, each task in its GPU recipe; every cell composes, and ``--cfg job`` prints and
validates cells on a machine without a GPU (nothing runs), while a run is still refused there."""

from __future__ import annotations

import pytest

from harness.cli.hydra_app import compatible_cells, expand_cells
from harness.compat import check
from harness.config import CONF_DIR, compose_config, validate_config

SUITE_GPU = ["sweep=suite_gpu"]
ALGORITHMS = {p.stem for p in (CONF_DIR / "algorithm").glob("*.yaml")}
RECIPES = {  # recipe -> (task, model, backend)
    "countdown_gpu": ("countdown", "qwen3_1p7b_base", "vllm_megatron"),
    "math_gpu": ("math", "qwen3_1p7b_base", "vllm_megatron"),
    "code_gpu": ("code", "qwen3_1p7b_base", "vllm_megatron"),
    "geometry3k_gpu": ("geometry3k", "qwen2p5_vl_3b_instruct", "vllm_hf"),
    "agentic_gpu": ("agentic_qa", "qwen3_1p7b_base", "vllm_megatron"),
}


@pytest.fixture(scope="module")
def pairs() -> tuple[list[list[str]], dict]:
    configs: dict = {}
    return compatible_cells(expand_cells(SUITE_GPU), SUITE_GPU, configs), configs


@pytest.mark.slow
def test_every_compatible_pair_composes_in_its_gpu_recipe_with_three_seeds(pairs):
    cells, configs = pairs
    assert len(configs) == 14 * 5 + 2 and len(cells) == 3 * len(configs)  # 72 pairs, 216 cells
    seen = set()
    for key, cfg in configs.items():
        recipe = next(o.partition("=")[2] for o in key if o.startswith("recipe="))
        task, model, backend = RECIPES[recipe]
        assert (str(cfg.task.name), cfg.task.variant, cfg.model.name, cfg.backend.name) == (
            task, "full", model, backend)
        # the update regime in which clip-based, importance-weighted and listwise losses differ
        batch = cfg.data.prompts_per_step * cfg.rollout.n
        assert batch // cfg.trainer.mini_batch_size == 4
        assert cfg.trainer.old_logprobs == "recompute"
        assert str(cfg.tracking.experiment) == "suite_gpu"
        assert check(cfg.algorithm, task, cfg.task).ok
        seen.add(str(cfg.algorithm.name))
    assert seen == ALGORITHMS


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_each_gpu_recipe_validates_without_a_gpu_only_when_nothing_runs(recipe):
    cfg = compose_config([f"recipe={recipe}", "algorithm=grpo"])
    validate_config(cfg, hardware=False)  # the task (its full data) and the algorithm build
    with pytest.raises(Exception, match="needs a CUDA GPU"):
        validate_config(compose_config([f"recipe={recipe}", "algorithm=grpo"]))


@pytest.mark.slow
def test_cfg_job_prints_gpu_cells_on_a_cpu_machine_and_a_run_is_refused(tmp_path, cli_env,
                                                                        rlbench_in_process):
    args = ["sweep", "sweep=suite_gpu", "recipe=countdown_gpu", "seed=0",
            "algorithm=grpo,dapo,lpo_fwd"]
    out = rlbench_in_process(*args, "--cfg", "job", env=cli_env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.count("# cell ") == 3 and out.stdout.count("name: vllm_megatron") == 3
    refused = rlbench_in_process(*args, env=cli_env, cwd=tmp_path)
    assert refused.returncode == 2 and "needs a CUDA GPU" in refused.stderr
