"""A real Trainer step on task=geometry3k_tiny model=tiny_vlm: the pixels every training
forward of the step receives (old log-probs recomputed, then the loss) are, row for row, the
pixels the rollout prefilled that row with; and a short run logs both eval sets.

Pixels are observed where every path feeds them to the model, ``embed_inputs``. The row-for-row
check is of the whole-row training forward (``backend.shared_prefix=false``): the shared-prefix
forward embeds one image set per distinct prompt and is pinned to the whole-row forward's
numbers in tests/backends/test_vlm_fast_path.py."""

from __future__ import annotations

import torch

from harness.trainer import Trainer
from tests.helpers import make_config

TINY = ["task=geometry3k_tiny", "model=tiny_vlm", "task.tiny.train_size=64",
        "task.tiny.eval_size=8", "task.tiny.eval.generated.n=2", "task.tiny.eval.generated.k=[1]",
        "task.tiny.eval.generated.maj_k=[1]", "task.tiny.eval.generated_shuffled.n=2",
        "task.tiny.eval.generated_shuffled.k=[1]", "task.tiny.eval.generated_shuffled.maj_k=[1]",
        "model.pretrain.steps=3", "model.pretrain.batch_size=16", "data.prompts_per_step=4",
        "rollout.n=3", "rollout.max_new_tokens=6", "trainer.steps=1", "trainer.eval_every=1",
        "trainer.checkpoint_every=0", "task.grader.workers=1"]


def test_trainer_step_trains_on_exactly_the_rollout_pixels(tmp_path, model_cache):
    cfg = make_config(tmp_path, model_cache, *TINY, "trainer.old_logprobs=recompute",
                      "trainer.micro_batch_size=5", "tracking.enabled=false",
                      "backend.shared_prefix=false")
    trainer = Trainer(cfg)
    trainer.setup()
    eng = trainer.engine
    pixels_seen: list[torch.Tensor] = []  # what the model itself embeds, call by call
    inner_embed = eng.model.embed_inputs

    def embed_spy(input_ids, pixel_values=None):
        if pixel_values is not None:
            pixels_seen.append(pixel_values.cpu())
        return inner_embed(input_ids, pixel_values)

    eng.model.embed_inputs = embed_spy
    prompts, forwards = [], []
    inner_generate, inner_forward = eng.generate, eng.forward

    def generate_spy(batch_prompts, params, **kw):
        prompts.extend(batch_prompts)
        out = inner_generate(batch_prompts, params, **kw)
        rollout_pixels.extend(pixels_seen)
        pixels_seen.clear()
        return out

    def forward_spy(mb, *args, **kw):
        out = inner_forward(mb, *args, **kw)
        (seen,) = pixels_seen  # one embedding per training forward, with pixels
        pixels_seen.clear()
        forwards.append((mb, seen))
        return out

    rollout_pixels: list[torch.Tensor] = []
    eng.generate, eng.forward = generate_spy, forward_spy
    trainer.train_step()
    # the rollout prefill got the prompts' own tensors, in prompt order
    (prefill,) = rollout_pixels
    assert torch.equal(prefill, torch.cat([p.mm_inputs["pixel_values"] for p in prompts]))
    # old log-probs (recomputed) and the loss: every training forward got exactly its rows'
    # tensors, and each row's tensor is the very one its prompt was prefilled with
    assert len(forwards) >= 2
    for mb, seen in forwards:
        for traj in mb.trajectories:
            assert any(traj.mm_inputs is p.mm_inputs for p in prompts)
        expected = torch.cat([t.mm_inputs["pixel_values"] for t in mb.trajectories])
        assert torch.equal(seen, expected)


def test_a_short_multimodal_run_logs_both_eval_sets(tmp_path, model_cache):
    cfg = make_config(tmp_path, model_cache, *TINY, "tracking.enabled=false")
    summary = Trainer(cfg).fit()
    for name in ("generated", "generated_shuffled"):
        assert 0.0 <= summary[f"final/{name}/pass_at_1"] <= 1.0
        assert f"start/{name}/pass_at_1" in summary
