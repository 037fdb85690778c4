"""Plain helpers shared by the test modules: constants, config builders, stand-ins and fakes.

Fixtures live in ``tests/conftest.py``; everything a test module imports from another test file
lives here, so no test module imports another (``tests/project/test_import_graph.py`` checks it).
Heavy libraries are imported inside the helpers that need them, so importing this module stays
cheap.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
"""The repository root."""

# A short warm start keeps the fixtures fast; the real recipe is conf/model/tiny.yaml.
FAST_PRETRAIN = ["model.pretrain.steps=30", "model.pretrain.batch_size=64"]

# -- configs -----------------------------------------------------------------------------------

SMALL = [
    "trainer.steps=3", "trainer.eval_every=2", "trainer.checkpoint_every=2",
    "data.prompts_per_step=4", "rollout.n=4",
    "task.tiny.eval.heldout.limit=16", "task.tiny.eval.heldout.n=4",
    "task.tiny.eval.heldout.k=[1,4]", "tracking.log_samples=2",
]
"""Overrides of a small in-process run: 3 steps, an evaluation at step 2 and a checkpoint."""


def make_config(tmp_path: Path, cache: Path, *overrides: str):
    """A composed config writing MLflow data and outputs under ``tmp_path``."""
    from harness.cli import compose_config

    return compose_config([
        *FAST_PRETRAIN,
        f"model.cache_dir={cache}",
        f"tracking.uri=sqlite:///{tmp_path / 'mlruns.db'}",
        f"trainer.output_dir={tmp_path / 'out'}",
        "trainer.status_every=0",
        "backend.threads=1",
        *overrides,
    ])


def rollout_batch(cfg, prompts_per_step: int):
    """A set-up ``Trainer`` for ``cfg`` and one batch sampled by its algorithm's rollout, as a
    training step would (no update yet): for tests that drive ``Trainer.update`` by hand."""
    from harness.rollout import RolloutContext
    from harness.trainer import Trainer

    tr = Trainer(cfg)
    tr._t_start = 0.0
    tr.setup()
    ctx = RolloutContext(engine=tr.engine, task=tr.task, draw_prompts=tr.sampler.draw,
                         prompts_per_step=prompts_per_step, sampling=tr.sampling,
                         shape_rewards=tr.algorithm.shape_rewards)
    return tr, tr.algorithm.rollout(ctx)


# -- the command line, as a user runs it (subprocesses) ----------------------------------------

RLBENCH = [sys.executable, "-m", "harness.cli"]
QUIET_RUN = [*FAST_PRETRAIN, "backend.threads=1", "data.prompts_per_step=4", "rollout.n=4",
             "task.tiny.eval.heldout.limit=16", "task.tiny.eval.heldout.n=4",
             "task.tiny.eval.heldout.k=[1,4]"]
"""Overrides of a quick ``rlbench train`` (the warm start of the fixtures, small batches)."""


def cli_environment(directory: Path, model_cache: Path, schema: Path) -> dict[str, str]:
    """Environment for ``rlbench`` subprocesses: this process's, without its command, with the
    model cache and an MLflow store ``directory/mlruns.db`` that starts as a copy of ``schema``
    (the session's migrated empty store, ``tests/conftest.py:mlflow_schema``)."""
    env = dict(os.environ)
    env.pop("RLBENCH_COMMAND", None)  # a subprocess is a command of its own
    env["RLBENCH_CACHE"] = str(model_cache)
    store = directory / "mlruns.db"
    if not store.exists():
        shutil.copyfile(schema, store)
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{store}"
    return env


def rlbench(*args: str, env: dict[str, str], cwd: Path, timeout: int = 300):
    """``rlbench ARGS`` in a subprocess; the completed process, output captured as text."""
    return subprocess.run([*RLBENCH, *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


# -- losses ------------------------------------------------------------------------------------

def make_mb(old_logp, advantages, mask):
    """A ``RolloutBatch`` of just what a policy loss reads: old log-probs, advantages, mask."""
    from harness.batch import RolloutBatch
    from harness.types import Trajectory

    B = old_logp.shape[0]
    tensors = {"old_logprobs": old_logp, "advantages": advantages, "response_mask": mask}
    return RolloutBatch(tensors, [Trajectory([], []) for _ in range(B)])


# -- models ------------------------------------------------------------------------------------

def tiny_hf(kind: str, tied: bool):
    """A random transformers model of the given family with GQA (4 heads, 2 KV heads)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

    common = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied,
                  max_position_embeddings=64)
    if kind == "qwen3":  # head_dim != hidden / heads, as in every Qwen3
        config = Qwen3Config(**common, head_dim=16)
    elif kind == "qwen2":
        config = Qwen2Config(**common)
    else:
        config = LlamaConfig(**common)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config)


# -- a fake vllm.LLM (no vllm import) ----------------------------------------------------------

class FakeLLM:
    """Records every call; ``generate`` answers each prompt with n completions whose ids are
    the prompt's last id + 1, + 2, ... and whose log-probs are -0.1 * position."""

    def __init__(self, **kwargs):
        self.kwargs, self.calls, self.loaded = kwargs, [], []
        model = SimpleNamespace(load_weights=self._load)
        self.llm_engine = SimpleNamespace(model_executor=SimpleNamespace(
            driver_worker=SimpleNamespace(model_runner=SimpleNamespace(model=model))))

    def _load(self, weights):
        names = [name for name, _ in weights]
        self.loaded.append(names)
        self.calls.append("load_weights")
        return set(names)

    def sleep(self, level=1):
        self.calls.append(f"sleep({level})")

    def wake_up(self, tags=None):
        self.calls.append(f"wake_up({','.join(tags) if tags else 'all'})")

    def reset_prefix_cache(self):
        self.calls.append("reset_prefix_cache")
        return True

    def generate(self, prompts, sampling_params, use_tqdm=True):
        self.calls.append("generate")
        self.prompts, self.params = prompts, sampling_params
        outs = []
        for prompt, sp in zip(prompts, sampling_params):
            last = prompt["prompt_token_ids"][-1]
            comps = []
            for j in range(sp["n"]):
                length = 2 + j
                ids = [(last + 1 + i) % 50 for i in range(length)]
                lps = [{tok: SimpleNamespace(logprob=-0.1 * (i + 1)),
                        (tok + 7) % 50: SimpleNamespace(logprob=-9.0)}
                       for i, tok in enumerate(ids)]
                reason = "length" if length >= sp["max_tokens"] else "stop"
                comps.append(SimpleNamespace(token_ids=ids, logprobs=lps, finish_reason=reason))
            outs.append(SimpleNamespace(outputs=comps))
        return outs


class FakeTrainEngine:
    """A train engine that exports two named tensors as its HF weights."""

    def __init__(self):
        import torch

        self.model = torch.nn.Linear(2, 2)

    def export_hf_weights(self):
        import torch

        yield "model.layers.0.mlp.up_proj.weight", torch.zeros(2, 2)
        yield "lm_head.weight", torch.ones(2, 2)


# -- a tiny Qwen2.5-VL (the model itself: the ``qwen_vl_path`` fixture of conftest) --------------

QWEN_VL_IMAGE_PROCESSOR = "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl"
QWEN_VL_SPECIALS = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                    "<|image_pad|>", "<|video_pad|>"]
QWEN_VL_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}"
    "{{ m['content'] }}{% else %}{% for c in m['content'] %}{% if c['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif c['type'] == 'text' %}{{ c['text'] }}"
    "{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


class StandInProcessor:
    """The two calls the engine makes of a Qwen2.5-VL processor, over the real image processor
    (``Qwen2_5_VLProcessor`` itself needs torchvision, absent on the CPU image)."""

    def __init__(self, tokenizer) -> None:
        import importlib

        pil_ip = importlib.import_module(QWEN_VL_IMAGE_PROCESSOR)
        self.tokenizer = tokenizer
        self.image_processor = pil_ip.Qwen2VLImageProcessorPil(min_pixels=56 * 56,
                                                               max_pixels=56 * 56)

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=False):
        return self.tokenizer.apply_chat_template(messages, chat_template=QWEN_VL_TEMPLATE,
                                                  add_generation_prompt=add_generation_prompt,
                                                  tokenize=tokenize)

    def __call__(self, text, images, return_tensors="pt"):
        import torch

        out = self.image_processor(images=images, return_tensors="pt")
        merge = self.image_processor.merge_size ** 2
        expanded = []
        for t in text:
            for thw in out["image_grid_thw"]:
                t = t.replace("<|image_pad|>", "<|placeholder|>" * int(thw.prod() // merge), 1)
            expanded.append(t.replace("<|placeholder|>", "<|image_pad|>"))
        ids = [self.tokenizer.encode(t, add_special_tokens=False) for t in expanded]
        return {"input_ids": torch.tensor(ids), **out}


def build_qwen_vl(path: Path) -> str:
    """Save a tiny random Qwen2.5-VL (2 text layers of width 64, a 1-block vision tower) over
    the character tokenizer plus Qwen's vision special tokens at ``path``; its path."""
    import torch
    import transformers

    from harness.models.tiny import build_char_tokenizer, save_tokenizer

    tok = build_char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": QWEN_VL_SPECIALS})
    ids = {t: tok.convert_tokens_to_ids(t) for t in QWEN_VL_SPECIALS}
    special = dict(pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                   bos_token_id=tok.bos_token_id)
    config = transformers.Qwen2_5_VLConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512,
                         rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}, **special),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                           out_hidden_size=64, patch_size=14, spatial_merge_size=2,
                           temporal_patch_size=2, fullatt_block_indexes=[0], window_size=56),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"], **special)
    torch.manual_seed(0)
    transformers.Qwen2_5_VLForConditionalGeneration(config).save_pretrained(path)
    save_tokenizer(tok, path)
    return str(path)


def load_benchmark(name: str):
    """``benchmarks/<name>.py`` as a module (benchmarks/ is not a package), once per process:
    registered in ``sys.modules`` first, where dataclasses look their module up."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def make_batch(rewards, groups, lengths=None):
    """Scored trajectories -> RolloutBatch; ``lengths`` are response lengths (default 3): the
    batch the advantage estimators' and the bundles' unit tests score."""
    from harness.batch import RolloutBatch
    from harness.types import Score, Trajectory

    lengths = lengths if lengths is not None else [3] * len(rewards)
    trajs = [Trajectory(prompt_ids=[5, 6], response_ids=list(range(7, 7 + n)), group_id=g,
                        score=Score(reward=float(r), correct=r > 0, parsed=True))
             for r, g, n in zip(rewards, groups, lengths, strict=True)]
    return RolloutBatch.from_trajectories(trajs, pad_id=0)


def right_wrong_task():
    """A task whose only correct response is the text ``right`` (rollout strategies' tests)."""
    from harness.task import Task
    from harness.types import Score

    class RightWrongTask(Task):
        name = "fake"

        def verify(self, example, response: str) -> Score:
            ok = response == "right"
            return Score(reward=float(ok), correct=ok, parsed=True)

    return RightWrongTask(None)


# -- engine equivalence (the fast decode and shared-prefix paths change no number) ---------------
def assert_same_trajectories(a, b) -> None:
    """Two rollouts sampled the same ids, finishes and stop strings, with log-probs and
    entropies within 1e-5."""
    import torch

    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.response_ids == y.response_ids
        assert x.finish_reason == y.finish_reason
        assert x.stop_string == y.stop_string
        torch.testing.assert_close(x.logprobs, y.logprobs, atol=1e-5, rtol=0)
        if x.entropy is not None or y.entropy is not None:
            torch.testing.assert_close(x.entropy, y.entropy, atol=1e-5, rtol=0)


def assert_engines_sample_alike(first, second, prompts, params, seed: int = 7) -> list:
    """Both engines, from generators of the same seed, sample the same trajectories (and some
    response is longer than one token, so decoding was exercised); returns the first's."""
    import torch

    a = first.generate(prompts, params, torch.Generator().manual_seed(seed))
    b = second.generate(prompts, params, torch.Generator().manual_seed(seed))
    assert_same_trajectories(a, b)
    assert any(len(t.response_ids) > 1 for t in a)
    return a


def loss_and_grads(eng, batch):
    """(log-probs, entropies, parameter gradients) of a loss with advantages of both signs
    through ``eng.forward``: what a training path must reproduce."""
    import torch

    eng.model.zero_grad()
    logp, ent = eng.forward(batch, 1.0, with_entropy=True)
    weights = torch.linspace(-1.0, 1.0, len(batch))[:, None]  # advantages of both signs
    (weights * logp * batch["response_mask"]).sum().backward()
    return logp.detach(), ent.detach(), [p.grad.clone() for p in eng.model.parameters()]


def save_tiny_vlm(path, arch) -> str:
    """A freshly initialised tiny VLM (32-pixel images, seed 0) and its tokenizer saved at
    ``path``; returns the path as a string."""
    from harness.models.tiny import save_tokenizer
    from harness.models.tiny_vlm import build_tiny_vlm, build_vlm_tokenizer

    tok = build_vlm_tokenizer()
    build_tiny_vlm(arch, tok, 32, seed=0).save_pretrained(path)
    save_tokenizer(tok, path)
    return str(path)


def md_table(board: Path, section: str, sub: str = "countdown-tiny/tiny") -> dict[str, dict]:
    """The first markdown table under ``## <section>`` of a board page (``board/sub/
    leaderboard.md``) as {row: {column: cell}}."""
    md = (board / sub / "leaderboard.md").read_text()
    body = md.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    table = body[body.index("\n|"):].split("\n\n", 1)[0]  # the section's first table
    lines = [line for line in table.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [dict(zip(header, (c.strip() for c in line.strip("|").split("|"))))
            for line in lines[2:]]
    return {r["row"]: r for r in rows}
