"""The TRL side of ``step_time.py``: the same RL step through TRL's ``GRPOTrainer``, timed
stage by stage with wrapped methods, plus the record both sides fill."""

from __future__ import annotations

import functools
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class SideResult:
    """Per-step timings of one side: ``stages[name]`` is one value per measured step."""

    step: list[float]
    stages: dict[str, list[float]] = field(default_factory=dict)
    interval: list[float] = field(default_factory=list)
    completion_len: list[float] = field(default_factory=list)
    reward: list[float] = field(default_factory=list)
    threads_seen: int = 0


# -- TRL ---------------------------------------------------------------------------------------
class StageTimer:
    """Wraps bound methods of one object to add their wall time to ``current[stage]``."""

    def __init__(self) -> None:
        self.current: dict[str, float] = defaultdict(float)
        self.wrapped: list[str] = []

    def wrap(self, obj: Any, method: str, stage: str) -> None:
        fn = getattr(obj, method, None)
        if fn is None:
            return  # another TRL version: the breakdown just loses this row

        @functools.wraps(fn)
        def timed(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.current[stage] += time.perf_counter() - t0

        setattr(obj, method, timed)
        self.wrapped.append(stage)


def trl_mismatches(cfg: Any) -> list[str]:
    """rlbench settings the TRL side does not follow."""
    out = []
    if cfg.trainer.old_logprobs == "recompute":
        out.append("old log-probs: rlbench recomputes them (trainer.old_logprobs=recompute, one "
                   "extra no-grad forward, time/old_logprob); TRL skips that forward on-policy "
                   "and uses the detached current log-probs")
    kl = float(cfg.algorithm.get("kl", {}).get("coef", 0.0) or 0.0)
    if kl != 0.0:
        out.append(f"KL: rlbench algorithm.kl.coef={kl} (reference forward, time/ref); TRL runs "
                   "with beta=0")
    if cfg.algorithm.name != "grpo":
        out.append(f"algorithm: rlbench runs {cfg.algorithm.name}; TRL runs its GRPO")
    batch = cfg.data.prompts_per_step * cfg.rollout.n
    if cfg.trainer.mini_batch_size not in (0, batch) or cfg.trainer.epochs != 1:
        out.append(f"update: rlbench trainer.epochs={cfg.trainer.epochs}, "
                   f"mini_batch_size={cfg.trainer.mini_batch_size}; TRL takes one optimizer "
                   "step over the whole batch")
    if cfg.trainer.micro_batch_size not in (0, batch) and cfg.trainer.micro_batch_size != (
        cfg.trainer.mini_batch_size or batch
    ):
        out.append(f"micro-batches: rlbench trainer.micro_batch_size="
                   f"{cfg.trainer.micro_batch_size}; TRL runs the batch in one forward/backward")
    if cfg.backend.dtype != "float32":
        out.append(f"dtype: rlbench backend.dtype={cfg.backend.dtype}; TRL side runs float32")
    if cfg.trainer.optim.schedule not in ("constant", "linear", "cosine"):
        out.append(f"lr schedule {cfg.trainer.optim.schedule} has no TRL equivalent")
    return out


def run_trl(cfg: Any, model_path: str, task: Any, threads: int, warmup: int, steps: int,
            after_step: Callable[[], None] | None = None) -> tuple[SideResult, dict[str, Any]]:
    """Train ``warmup + steps`` TRL steps; ``after_step`` runs after each one, outside the
    timed span and the step-to-step interval (it interleaves the rlbench steps)."""
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from harness.models.tiny import load_tokenizer

    torch.set_num_threads(threads)
    tokenizer = load_tokenizer(model_path)
    # the same attention kernel as rlbench's engine (model.attn_implementation)
    attn = {"attn_implementation": cfg.model.attn_implementation} if (
        cfg.model.attn_implementation) else {}
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, **attn)
    pool = task.train_examples()
    dataset = Dataset.from_dict({
        "prompt": [ex.prompt for ex in pool],
        "example_index": list(range(len(pool))),
    })

    def countdown_reward(completions: list[str], example_index: list[int],
                         **_: Any) -> list[float]:
        return [task.verify(pool[i], text).reward for i, text in zip(example_index, completions)]

    optim = cfg.trainer.optim
    batch = cfg.data.prompts_per_step * cfg.rollout.n
    schedule = {"constant": "constant", "linear": "linear", "cosine": "cosine"}.get(
        optim.schedule, "constant")
    if schedule == "constant" and optim.warmup_steps > 0:
        schedule = "constant_with_warmup"
    tmp = tempfile.TemporaryDirectory(prefix="rlbench-trl-")
    # per_device_train_batch_size counts completions, not prompts; with
    # gradient_accumulation_steps=1 TRL sets steps_per_generation=1 and generation_batch_size
    # = per_device_train_batch_size, so one optimizer step generates and consumes exactly
    # prompts x n completions (prompts prompts, each repeated num_generations times), once.
    config = trl.GRPOConfig(
        output_dir=tmp.name,
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=1,
        num_generations=cfg.rollout.n,
        num_iterations=1,
        max_completion_length=cfg.rollout.max_new_tokens,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        top_k=cfg.rollout.top_k,
        learning_rate=optim.lr,
        adam_beta1=optim.betas[0],
        adam_beta2=optim.betas[1],
        adam_epsilon=optim.eps,
        weight_decay=optim.weight_decay,
        max_grad_norm=optim.grad_clip,
        lr_scheduler_type=schedule,
        warmup_steps=optim.warmup_steps,
        beta=0.0,
        epsilon=cfg.algorithm.loss.get("clip_low", 0.2),
        epsilon_high=cfg.algorithm.loss.get("clip_high", 0.2),
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        max_steps=warmup + steps,
        logging_strategy="no",
        logging_steps=10**9,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=cfg.seed,
        dataloader_num_workers=0,
    )
    timer = StageTimer()
    result = SideResult(step=[], stages=defaultdict(list))

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.t0 = self.last_end = 0.0
            self.trainer: Any = None  # set once the trainer exists, to read its rollout metrics

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.last_end = time.perf_counter()

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            timer.current.clear()
            result.threads_seen = torch.get_num_threads()
            self.t0 = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            now = time.perf_counter()
            if state.global_step > warmup:
                span = now - self.t0
                result.step.append(span)
                result.interval.append(now - self.last_end)
                stage = dict(timer.current)
                rollout = stage.get("rollout", 0.0)
                gen, reward = stage.get("gen", 0.0), stage.get("reward", 0.0)
                result.stages["generate (model.generate)"].append(gen)
                result.stages["reward (verifier)"].append(reward)
                result.stages["rollout other (tok, decode, adv)"].append(rollout - gen - reward)
                result.stages["update (fwd, bwd, clip, AdamW)"].append(span - rollout)
                # TRL appends one value per generation and clears them when it logs (at the end)
                logged = self.trainer._metrics.get("train", {}) if self.trainer else {}
                for key, out in (("completions/mean_length", result.completion_len),
                                 ("reward", result.reward)):
                    if logged.get(key):
                        out.append(float(logged[key][-1]))
            if after_step is not None:
                after_step()
            self.last_end = time.perf_counter()

    clock = StepClock()
    trainer = trl.GRPOTrainer(
        model=model, reward_funcs=countdown_reward, args=config, train_dataset=dataset,
        processing_class=tokenizer, callbacks=[clock],
    )
    clock.trainer = trainer
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    timer.wrap(trainer, "_generate_and_score_completions", "rollout")
    timer.wrap(trainer, "_generate_single_turn", "gen")
    timer.wrap(trainer, "_calculate_rewards", "reward")
    trainer.train()
    if len(timer.wrapped) < 3:
        result.stages.clear()  # methods renamed in this TRL version: no breakdown
    info = {
        "trl": trl.__version__,
        "per_device_train_batch_size": trainer.args.per_device_train_batch_size,
        "generation_batch_size": trainer.args.generation_batch_size,
        "steps_per_generation": trainer.args.steps_per_generation,
        "num_generations": trainer.args.num_generations,
        "num_iterations": trainer.args.num_iterations,
        "loss_type": trainer.args.loss_type,
        "scale_rewards": trainer.args.scale_rewards,
        "lr_scheduler_type": str(trainer.args.lr_scheduler_type).split(".")[-1].lower(),
        "gradient_checkpointing": trainer.args.gradient_checkpointing,
        "bf16": trainer.args.bf16,
        "device": str(trainer.args.device),
    }
    tmp.cleanup()
    return result, info


def prompt_tokenization_matches(tokenizer: Any, prompts: list[str]) -> bool:
    """TRL tokenizes plain-text prompts with ``tokenizer(text=...)`` (special tokens on);
    rlbench with ``encode(add_special_tokens=False)``. Equal when no BOS/EOS is added."""
    trl_ids = tokenizer(text=prompts)["input_ids"]
    ours = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    return trl_ids == ours


# -- main --------------------------------------------------------------------------------------
