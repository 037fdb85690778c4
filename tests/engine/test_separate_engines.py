"""The trainer with separate rollout and train engines, exercised on CPU with a stand-in for
vLLM: a transformers rollout engine that, like vLLM, holds its own copy of the weights, receives
them through ``update_weights`` and is put to sleep after each rollout phase. Checks the data
flow the GPU backends rely on: the copy is synced at start and after every update, old
log-probs are recomputed by the train engine, the mismatch metrics are logged (about zero here:
same fp32 weights), and truncated IS runs when asked."""

from __future__ import annotations

import pytest
import torch

from harness.backends.hf import HFEngine
from harness.registry import BACKENDS
from harness.trainer import Trainer
from tests.helpers import SMALL, make_config


class CopyingRolloutEngine(HFEngine):
    """An HF engine with its own weights, synced from the train engine like vLLM's."""

    receives_weights = True
    syncs = 0
    sleeps = 0

    def __init__(self, model_path, backend_cfg, seed, **kwargs):
        super().__init__(model_path, backend_cfg, seed + 1)

    def update_weights(self, train_engine):
        type(self).syncs += 1
        self.model.load_state_dict(train_engine.model.state_dict())

    def sleep(self):
        type(self).sleeps += 1


if "hf_copy_test" not in BACKENDS:
    BACKENDS.register("hf_copy_test", CopyingRolloutEngine)


def _trainer(tmp_path, model_cache, *overrides) -> Trainer:
    cfg = make_config(tmp_path, model_cache, *SMALL, "tracking.enabled=false",
                      "trainer.eval_every=0", "trainer.checkpoint_every=0",
                      "backend.rollout=hf_copy_test", "backend.train=hf", *overrides)
    tr = Trainer(cfg)
    tr._t_start = 0.0
    tr.setup()
    return tr


def _same_weights(a, b) -> bool:
    sb = b.state_dict()
    return all(torch.equal(v, sb[k]) for k, v in a.state_dict().items())


@pytest.mark.slow
def test_separate_engines_sync_after_every_update(tmp_path, model_cache):
    CopyingRolloutEngine.syncs = CopyingRolloutEngine.sleeps = 0
    tr = _trainer(tmp_path, model_cache, "trainer.optim.lr=1e-2")
    assert tr.rollout_engine is not tr.engine and CopyingRolloutEngine.syncs == 1
    assert _same_weights(tr.rollout_engine.model, tr.engine.model)
    before = {k: v.clone() for k, v in tr.engine.model.state_dict().items()}
    for _ in range(2):
        metrics = tr.train_step()
    assert CopyingRolloutEngine.syncs == 3 and CopyingRolloutEngine.sleeps == 2
    assert "time/sync" in metrics
    changed = any(not torch.equal(v, before[k]) for k, v in tr.engine.model.state_dict().items())
    if metrics.get("actor/tokens_trained", 0) > 0:
        assert changed
    assert _same_weights(tr.rollout_engine.model, tr.engine.model)
    # the sampler's and the trainer's log-probs of the same tokens: same fp32 weights
    assert metrics["rollout_corr/logprob_abs_diff_max"] < 1e-4
    assert "rollout/entropy" in metrics


def test_truncated_is_runs_through_the_trainer(tmp_path, model_cache):
    tr = _trainer(tmp_path, model_cache, "trainer.rollout_correction.mode=token_truncate",
                  "trainer.rollout_correction.cap=2.0")
    metrics = tr.train_step()
    assert abs(metrics["rollout_corr/is_weight_mean"] - 1.0) < 1e-3
    assert metrics["rollout_corr/is_capped_frac"] == 0.0


def test_shared_engine_default_logs_no_mismatch_metrics(tmp_path, model_cache):
    tr = _trainer(tmp_path, model_cache, "backend.rollout=hf")
    assert tr.rollout_engine is tr.engine
    metrics = tr.train_step()
    assert not any(k.startswith("rollout_corr/") for k in metrics)


def test_rollout_engine_that_cannot_take_weights_is_refused(tmp_path, model_cache):
    """A rollout engine that cannot receive the train engine's weights would sample from its own
    (untrained) copy for the whole run: refused before anything is built."""
    import pytest

    from harness.engines import build_engines
    from harness.typed_config import ConfigError

    class NoCopy(HFEngine):
        receives_weights = False

    if "hf_nocopy_test" not in BACKENDS:
        BACKENDS.register("hf_nocopy_test", NoCopy)
    cfg = make_config(tmp_path, model_cache, *SMALL, "tracking.enabled=false",
                      "backend.rollout=hf_nocopy_test", "backend.train=hf")
    with pytest.raises(ConfigError, match=r"backend\.rollout='hf_nocopy_test' cannot take weights"):
        build_engines(cfg, None, need_reference=False)
