"""The run's declared contracts: engine protocols with declared capabilities (no probes), the
task and algorithm built once per run, and the resume state saved and restored by one table."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest

from harness.engines import RolloutEngine, TrainEngine
from harness.ledger import CostLedger, LoopState, upgrade_state
from tests.helpers import make_config

ROOT = Path(__file__).resolve().parents[2]


def test_every_built_in_backend_subclasses_the_protocols_of_its_roles():
    from harness.backends.hf import HFEngine
    from harness.backends.megatron_engine import MegatronEngine
    from harness.backends.vllm_engine import VLLMEngine

    assert TrainEngine in HFEngine.__mro__ and RolloutEngine in HFEngine.__mro__
    assert RolloutEngine in VLLMEngine.__mro__ and VLLMEngine.receives_weights
    assert TrainEngine in MegatronEngine.__mro__ and MegatronEngine.cpu_mode
    # capabilities are declared with defaults: an engine that says nothing gets them
    assert (RolloutEngine.receives_weights, RolloutEngine.can_forward,
            RolloutEngine.gen_batch_size) == (False, False, 0)
    assert HFEngine.can_forward and not HFEngine.receives_weights


def test_every_registered_estimator_and_loss_declares_its_protocol():
    import algorithms  # noqa: F401  (registers every bundle)
    from harness.algorithm import AdvantageEstimator, PolicyLoss
    from harness.registry import ADVANTAGES, POLICY_LOSSES

    for name in ADVANTAGES.names():
        assert AdvantageEstimator in ADVANTAGES.get(name).__mro__, name
    for name in POLICY_LOSSES.names():
        assert PolicyLoss in POLICY_LOSSES.get(name).__mro__, name


@pytest.mark.parametrize("path", ["harness/trainer.py", "harness/algorithm.py",
                                  "harness/evaluation.py", "harness/rollout.py",
                                  "algorithms/arpo.py", "algorithms/aem.py"])
def test_the_loop_reads_declared_capabilities_instead_of_probing(path):
    """``getattr(x, name, default)`` / ``hasattr`` on an engine, estimator or loss hides a
    contract: the capability belongs on the protocol (harness/engines.py, harness/algorithm.py)."""
    tree = ast.parse((ROOT / path).read_text())
    probes = [f"line {n.lineno}" for n in ast.walk(tree) if isinstance(n, ast.Call)
              and isinstance(n.func, ast.Name) and n.func.id in ("getattr", "hasattr")]
    assert not probes, f"{path}: {probes}"


def test_every_field_of_the_loop_state_is_saved_and_restored():
    state = LoopState()
    # a value unlike the default for every field, the ledger's included
    for f in dataclasses.fields(CostLedger):
        setattr(state.ledger, f.name, {"gen": 1.5} if f.name == "stage_s" else 7.25)
    for f in dataclasses.fields(LoopState):
        if f.name == "step":
            state.step = 5
        elif f.name == "eval_history":
            state.eval_history = [{"step": 4, "eval/heldout/pass_at_1": 0.5}]
        else:
            assert f.name == "ledger", f"new LoopState field {f.name}: give it a value here"
    saved = json.loads(json.dumps(state.state_dict()))
    back = LoopState()
    back.load_state_dict(saved)
    assert back.step == 5 and back.eval_history == state.eval_history
    for f in dataclasses.fields(CostLedger):
        if f.name == "wall_s":  # the saved wall time includes this process's seconds so far
            assert back.ledger.wall_s >= 7.25
        elif f.name == "peak_mem_mb":  # the max with this process's peak
            assert back.ledger.peak_mem_mb >= 7.25
        else:
            assert getattr(back.ledger, f.name) == getattr(state.ledger, f.name), f.name


def test_a_checkpoint_from_before_the_loop_state_object_still_resumes():
    flat = {"step": 3, "tokens_total": 10.0, "tokens_trained": 4.0,
            "stage_totals": {"gen": 2.0}, "peak_mem_mb": 9.0, "wall_s": 5.0,
            "eval_history": [{"step": 0}], "sampler": {"epoch": 0, "position": 3},
            "algorithm": {"k": 1}, "run_id": "r", "python_rng": [3, [1], None],
            "torch_rng": [0], "numpy_rng": ["MT19937", [1], 0, 0, 0.0]}
    state = upgrade_state(flat)
    loop = LoopState()
    loop.load_state_dict(state["loop"])
    assert (loop.step, loop.ledger.tokens_total, loop.ledger.tokens_trained) == (3, 10.0, 4.0)
    assert loop.ledger.stage_s == {"gen": 2.0} and loop.eval_history == [{"step": 0}]
    assert state["sampler"] == flat["sampler"] and state["algorithm"] == {"k": 1}
    assert set(state["rng"]) == {"python_rng", "torch_rng", "numpy_rng"}
    assert upgrade_state(state) is state


@pytest.mark.slow
def test_a_checkpoint_holds_exactly_the_resumables_and_restores_each_of_them(tmp_path, model_cache):
    """A run of one step is saved; a fresh trainer of the same cell loads it and reports the same
    state for every resumable part (the RNGs, the sampler, the algorithm, the loop)."""
    from harness.trainer import Trainer

    cfg = make_config(tmp_path, model_cache, "trainer.steps=1", "trainer.eval_every=0",
                      "data.prompts_per_step=2", "rollout.n=2", "tracking.enabled=false",
                      "trainer.checkpoint_every=1")
    first = Trainer(cfg)
    first.fit()
    ckpt = first.last_checkpoint
    saved = json.loads((ckpt / "trainer_state.json").read_text())
    assert set(saved) == set(first.resumables()) | {"run_id", "config"}

    again = Trainer(make_config(tmp_path, model_cache, "trainer.steps=1", "trainer.eval_every=0",
                                "data.prompts_per_step=2", "rollout.n=2",
                                "tracking.enabled=false", f"trainer.resume={ckpt}"))
    plan = again.setup()
    assert plan.action == "resume"
    restored = json.loads(json.dumps({name: save() for name, (save, _) in
                                      again.resumables().items()}))
    for name in ("sampler", "algorithm", "rng"):
        assert restored[name] == saved[name], name
    assert restored["loop"]["step"] == saved["loop"]["step"] == 1
    assert restored["loop"]["ledger"]["tokens_total"] == saved["loop"]["ledger"]["tokens_total"]


def test_a_single_run_builds_its_task_and_algorithm_once(tmp_path, model_cache, monkeypatch):
    """``rlbench train``: the CLI's check of the cell builds them; the run uses what it built."""
    import harness.algorithm
    import harness.typed_config
    from harness.cli.hydra_app import run
    from harness.registry import TASKS

    counts = {"algorithm": 0, "task": 0}
    build_algorithm, build = harness.algorithm.build_algorithm, harness.typed_config.build

    def counting_algorithm(*args, **kwargs):
        counts["algorithm"] += 1
        return build_algorithm(*args, **kwargs)

    def counting_build(registry, *args, **kwargs):
        counts["task"] += registry is TASKS
        return build(registry, *args, **kwargs)

    monkeypatch.setattr(harness.algorithm, "build_algorithm", counting_algorithm)
    monkeypatch.setattr(harness.typed_config, "build", counting_build)
    monkeypatch.chdir(tmp_path)
    run("train", ["model.pretrain.steps=30", "model.pretrain.batch_size=64",
                  f"model.cache_dir={model_cache}", "trainer.steps=1", "trainer.eval_every=0",
                  "data.prompts_per_step=2", "rollout.n=2", "tracking.enabled=false",
                  "backend.threads=1", f"trainer.output_dir={tmp_path / 'out'}"])
    assert (tmp_path / "out" / "checkpoints").is_dir()
    assert counts == {"algorithm": 1, "task": 1}
