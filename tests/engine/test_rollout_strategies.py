"""Rollout strategies that change what is sampled (LOPE's resampling, arbitrary-entropy's side
batch) in the real trainer on the tiny model: they run, log their metrics, keep pi_old right for
rows sampled at another temperature, and resume with their controller state."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from harness.batch import RolloutBatch
from harness.trainer import Trainer, rollout_metrics
from harness.types import Trajectory
from tests.helpers import make_config

SMALL = ["trainer.steps=2", "trainer.eval_every=0", "trainer.checkpoint_every=1",
         "data.prompts_per_step=8", "rollout.n=4"]
CASES = {
    "lope": ["algorithm=lope", "algorithm.rollout.word_min=1", "algorithm.rollout.word_max=2",
             "algorithm.rollout.separator=' '", "algorithm.rollout.num_perturbation=2",
             "algorithm.rollout.rollout_n_per_perturbation=2"],
    "arbitrary_entropy": ["algorithm=arbitrary_entropy"],
}
LOGGED = {
    "lope": ["lope/all_wrong_groups", "lope/rescued_groups", "lope/replaced_rows",
             "lope/extra_tokens", "lope/pooled_groups"],
    "arbitrary_entropy": ["aent/temperature", "aent/entropy_proxy", "aent/substituted",
                          "aent/positives", "aent/extra_tokens"],
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.slow
def test_strategy_runs_in_the_trainer_and_logs_its_metrics(tmp_path, model_cache, name):
    cfg = make_config(tmp_path, model_cache, *SMALL, *CASES[name])
    Trainer(cfg).fit()
    client = MlflowClient(cfg.tracking.uri)
    [run] = client.search_runs([client.get_experiment_by_name("rlbench").experiment_id])
    assert run.info.status == "FINISHED"
    for key in LOGGED[name]:
        assert len(client.get_metric_history(run.info.run_id, key)) == 2, key
    samples = client.get_metric_history(run.info.run_id, "rollout/samples")
    assert {m.value for m in samples} == {32.0}  # the training batch keeps its size
    if name == "arbitrary_entropy":
        temps = client.get_metric_history(run.info.run_id, "aent/temperature")
        assert sorted(temps, key=lambda m: m.step)[0].value == 1.2  # proxy 0 before any update


@pytest.mark.slow
def test_arbitrary_entropy_resume_restores_the_entropy_proxy(tmp_path, model_cache):
    cfg = make_config(tmp_path, model_cache, *SMALL, *CASES["arbitrary_entropy"])
    trainer = Trainer(cfg)
    trainer.fit()
    saved = trainer.algorithm.state_dict()["entropy_proxy"]
    assert saved > 0
    again = Trainer(make_config(tmp_path, model_cache, *SMALL, *CASES["arbitrary_entropy"],
                                "trainer.steps=3", f"trainer.resume={tmp_path / 'out'}"))
    again.setup()
    assert again.algorithm.rollout.entropy_proxy == saved


def _batch(temperatures: list[float], offpolicy: list[bool]) -> RolloutBatch:
    trajs = [Trajectory([1, 2], [3, 4], logprobs=torch.tensor([-0.1, -0.2]),
                        entropy=torch.tensor([0.5, 0.5]) * (i + 1), temperature=t,
                        is_offpolicy=o)
             for i, (t, o) in enumerate(zip(temperatures, offpolicy))]
    return RolloutBatch.from_trajectories(trajs, 0)


def test_rows_sampled_at_another_temperature_get_pi_old_at_the_training_temperature():
    batch = _batch([1.0, 1.2, 0.8, 1.0], [False, False, False, True])
    fake = SimpleNamespace(
        separate_engines=False,
        cfg=OmegaConf.create({"rollout": {"temperature": 1.0},
                              "trainer": {"old_logprobs": "rollout"}}),
        engine=SimpleNamespace(logprobs=lambda b, t, m: torch.full(b["responses"].shape, -7.0)))
    old = Trainer.old_logprobs(fake, batch, 0)
    assert old[0].tolist() == pytest.approx([-0.1, -0.2])  # sampled at T = 1: reused
    assert old[1].tolist() == old[2].tolist() == [-7.0, -7.0]  # recomputed at T = 1
    assert old[3].tolist() == pytest.approx([-0.1, -0.2])  # off-policy: behaviour log-probs


def test_rollout_entropy_counts_only_rows_sampled_from_the_policy_itself():
    batch = _batch([1.0, 1.2, 1.0], [False, False, True])
    batch["rewards"] = torch.zeros(3)
    batch["correct"] = batch["parsed"] = torch.zeros(3, dtype=torch.bool)
    assert rollout_metrics(batch, 1.0)["rollout/entropy"] == pytest.approx(0.5)
